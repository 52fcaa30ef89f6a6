"""Full causal attention (MHA, GQA, MQA, and MLA's core): query i sees keys j <= i.

A fused kernel skips the key tiles wholly above the diagonal (FlashAttention-2, Dao 2023,
Sec. 3.1.1), costed as half of the T x T pairs (the diagonal tiles' masked halves left out);
the naive kernel computes every score and masks with one T x T bool mask, shared by all
layers (``validate/reference/model.py``: ``ones``, ``triu``); the fused one needs none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.symbols.core import T
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


class Causal:
    """The causal core: T(T+1)/2 useful pairs of T x T."""

    name = "causal"

    def fused_pairs(self) -> sp.Expr:
        return T * T / 2

    def naive_pairs(self) -> sp.Expr:
        return T * T

    def useful_pairs(self) -> sp.Expr:
        return T * (T + 1) / 2

    def mask_bytes(self, kernel: str, act: int) -> sp.Expr:
        return T * T if kernel == "naive" else integer(0)

    def mask_kernels(self, kernel: str) -> int:
        return 2 if kernel == "naive" else 0

    def cached_keys(self) -> sp.Expr:
        """Tokens a layer caches per sequence at context T (and a decode query reads): all."""
        return T


CAUSAL = Causal()
