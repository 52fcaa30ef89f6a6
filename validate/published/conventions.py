"""The FLOPs per sequence a published run's quoted TFLOP/s or MFU counts, by its
``flops_convention`` (``validate.published.corpus`` converts a quoted rate to tokens/s with
them): Megatron-Core's ``num_floating_point_operations`` (``model``), Narayanan et al.
2021's (``narayanan-2021``, the recomputed forward counted), and PaLM's as MaxText counted
it (``palm``, ``palm-causal``, ``six-n``)."""

from __future__ import annotations

from collections.abc import Callable

from costmodel.single.params import param_breakdown
from costmodel.specs.model import ModelSpec
from costmodel.symbols.core import values_for


def _model_flops(model: ModelSpec, seq: int) -> float:
    s, h, L, V = seq, model.d_model, model.n_layers, model.vocab
    q = model.n_heads * model.head_dim / h
    gate = 1.5 if model.ffn == "swiglu" else 1.0
    attn = (1 + model.n_kv_heads / model.n_heads + s / h) * q
    return 12 * s * L * h**2 * (attn + gate * model.d_ff / h + V / (2 * L * h))


def _narayanan_flops(model: ModelSpec, seq: int) -> float:
    s, h, L, V = seq, model.d_model, model.n_layers, model.vocab
    return 96 * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))


def _palm(attention: float) -> Callable[[ModelSpec, int], float]:
    """PaLM's count (Chowdhery et al. 2022, App. B), as MaxText's ``calculate_training_
    tflops`` (train.py) ran it: 6·N·s for the weights, N every parameter (a tied table
    once), plus ``attention`` x 12·H·L·d_h·s²: 1 as PaLM writes it (MaxText @e47fa1b5),
    1/2 for causal attention (@76bd53b0), 0 for the weights alone (@281e04bf)."""

    def flops(model: ModelSpec, seq: int) -> float:
        n = float(param_breakdown(model)["total"].subs(values_for(model)))
        core = 12 * model.n_heads * model.n_layers * model.head_dim * seq**2
        return 6 * n * seq + attention * core

    return flops


FLOP_CONVENTIONS: dict[str, Callable[[ModelSpec, int], float]] = {
    "model": _model_flops,
    "narayanan-2021": _narayanan_flops,
    "palm": _palm(1.0),
    "palm-causal": _palm(0.5),
    "six-n": _palm(0.0),
}
"""FLOPs per sequence per step by ``flops_convention`` (see the module docstring)."""


def flops_per_sequence(convention: str, model: ModelSpec, seq: int) -> float:
    """FLOPs a source counts per sequence per step under its convention."""
    return FLOP_CONVENTIONS[convention](model, seq)
