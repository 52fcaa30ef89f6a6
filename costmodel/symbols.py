"""Every symbol of the cost model, declared once with its assumptions.

Letters follow the Scaling Book (Austin et al. 2025, "How to Scale Your Model"): B batch,
T sequence length, D model width, F FFN width, L layers, H query heads, K key/value heads,
V vocabulary. ``d_h`` is the head width, ``P`` the learned-position table length and ``b``
the micro-batch (``B`` divided by the gradient-accumulation steps).
"""

from __future__ import annotations

import sympy as sp

_INT = {"integer": True, "positive": True}

B, b, T = sp.symbols("B b T", **_INT)
V, D, F, L, H, K, P = sp.symbols("V D F L H K P", **_INT)
d_h = sp.Symbol("d_h", **_INT)

MODEL_SYMBOLS: tuple[sp.Symbol, ...] = (V, D, F, L, H, K, d_h, P)
TRAIN_SYMBOLS: tuple[sp.Symbol, ...] = (B, b, T)
ALL_SYMBOLS: tuple[sp.Symbol, ...] = MODEL_SYMBOLS + TRAIN_SYMBOLS

DESCRIPTIONS: dict[sp.Symbol, str] = {
    V: "vocabulary size",
    D: "model width (d_model)",
    F: "FFN hidden width (d_ff)",
    L: "layers",
    H: "query heads",
    K: "key/value heads",
    d_h: "head width",
    P: "learned position table length",
    B: "sequences per optimizer step",
    b: "sequences per micro-batch",
    T: "sequence length (tokens)",
}


def values_for(model, train=None) -> dict[sp.Symbol, int]:
    """Symbol -> integer value for a ModelSpec (and optionally a TrainSpec)."""
    values = {
        V: model.vocab,
        D: model.d_model,
        F: model.d_ff,
        L: model.n_layers,
        H: model.n_heads,
        K: model.n_kv_heads,
        d_h: model.head_dim,
        P: model.max_positions,
    }
    if train is not None:
        values.update({B: train.batch, b: train.micro_batch, T: train.seq})
    return values
