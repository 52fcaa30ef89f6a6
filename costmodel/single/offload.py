"""What one transformer block keeps, streams and re-runs when its activations live on the host.

Host-offloaded training (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al.
2021, Sec. 5) streams each block's weights to the device, runs the block, and moves what
backward needs to host memory. Per block and per token, a block's saved activations can
be kept in one of three forms, each re-running a different part of the block in backward:

* ``full``: everything the block keeps (:func:`costmodel.single.memory.activation_memory`'s
  per-block terms, no recomputation);
* ``attn``: the block input, the attention context (K and V) and the fused attention
  kernel's output O and logsumexp: backward re-runs the input norm and Q projection (for
  the attention backward), the output projection, the FFN norm and the FFN's matmuls but
  its last (whose output only feeds the next block, saved there);
* ``ctx``: the block input and K, V: backward also re-runs the attention core's forward.

Units: bytes per token per block, FLOPs per token per block; T is the sequence length
(attention's context). Needs a fused (flash) attention kernel: the naive kernel's T x T
scores are not per-token quantities.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.single.flops import forward_flops_by_op
from costmodel.single.memory import activation_memory
from costmodel.single.params import ffn_matrices
from costmodel.single.precision import PRECISIONS, STAT_BYTES
from costmodel.specs.checks import SpecError
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.core import B, D, H, K, L, T, b, d_h
from costmodel.symbols.ops import add, expand, integer, ratio

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

SAVE_MODES = ("full", "attn", "ctx")
"""How an offloaded block's activations are kept, most bytes (no recomputation) first."""

_BLOCK_PARTS = ("attn_norm", "attn_input", "attention", "attn_out_input", "ffn_norm",
                "ffn_input", "ffn_hidden", "dropout_masks")  # fmt: skip
"""The per-block terms of ``activation_memory`` (each is L x one block's bytes)."""


def _check(model: ModelSpec, train: TrainSpec) -> None:
    if model.ffn_only:
        raise SpecError("model", "offload planning needs a decoder LM (attention blocks)")
    if train.attention != "flash":
        raise SpecError(
            "attention", "offload planning needs attention=flash (chunks keep K/V, not scores)"
        )


def saved_bytes_per_token(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """Bytes one block keeps per token in each save mode (see the module docstring)."""
    _check(model, train)
    prec = PRECISIONS[train.precision]
    acts = activation_memory(model, train.replace(recompute="none"))
    per_token = {b: 1, T: 1, L: 1}
    full = add(*(acts[k] for k in _BLOCK_PARTS if k in acts)).subs(per_token)
    block_input = prec.residual * D
    context = 2 * prec.activation * K * d_h
    attention_out = prec.activation * H * d_h + STAT_BYTES * H
    return {
        "full": expand(full),
        "attn": block_input + context + attention_out,
        "ctx": block_input + context,
    }


def recompute_flops_per_token(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """Forward FLOPs backward re-runs per token per block in each save mode (full: none).

    From :func:`costmodel.single.flops.forward_flops_by_op` (Kaplan et al. 2020, Table 1):
    Q and O projections and all but the last FFN matmul; ``ctx`` adds QK^T and PV over
    the T-token context (counted dense, as FlopCounterMode counts them).
    """
    _check(model, train)
    ops = {k: v / (B * T * L) for k, v in forward_flops_by_op(model).items()}
    m = ffn_matrices(model)
    attn = ops["attn_q"] + ops["attn_o"] + ops["ffn"] * ratio(m - 1, m)
    return {
        "full": integer(0),
        "attn": expand(attn),
        "ctx": expand(attn + ops["attn_scores"] + ops["attn_values"]),
    }
