"""Sliding-window (local) attention: query i sees keys i - W < j <= i.

Mistral 7B (Jiang et al. 2023, Sec. 2) on every layer; Gemma 2 (Gemma Team 2024, Sec. 2)
and gpt-oss on every other layer, Gemma 3 (Gemma Team 2025, Sec. 2) on five of six, the
rest global (``ModelSpec.global_every``). With Wm = min(T, W), a sequence has
T·Wm - Wm(Wm - 1)/2 useful pairs (each of the first Wm queries sees itself and all before
it, every later one W keys). A fused kernel computes whole tiles: a query tile of B rows
reads every key tile its rows' bands touch (FlashAttention-2, Dao 2023, Alg. 1 with the
masked tiles skipped as in Sec. 3.1.1; tiles B_r = B_c = ``TILE``). On the causal kind's
footing (half of T x T: the diagonal tiles' masked halves left out) a window aligned to
the tiles computes the pairs of a band B/2 wider, to B²/8 per sequence; when W + B/2 >= T
that is the causal count. The naive kernel computes every score and masks with a T x T
bool mask (``ones``, ``triu``, ``tril``, ``or``); the fused kernel on CPU (and SDPA on
CUDA) takes an additive mask in the compute dtype, built from it (``zeros``,
``masked_fill``), and keeps it for backward: one mask for all local layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.symbols.core import T, W_sw, smin

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

TILE = 128
"""Rows of a query tile and of a key tile (B_r = B_c): FlashAttention-2's blocks are
{64, 128} x {64, 128} (Dao 2023, Sec. 3.3); its forward kernels take 128-row query tiles."""


def band(width: sp.Expr) -> sp.Expr:
    """Pairs of a causal band ``width`` keys wide on T queries: T·w - w(w - 1)/2 with
    w = min(T, width) (each query sees min(i + 1, width) keys)."""
    w = smin(T, width)
    return T * w - w * (w - 1) / 2


class Window:
    """The local core: a band of W keys per query."""

    name = "window"

    def fused_pairs(self) -> sp.Expr:
        w = smin(T, W_sw + TILE // 2)
        return T * w - w * w / 2

    def naive_pairs(self) -> sp.Expr:
        return T * T

    def useful_pairs(self) -> sp.Expr:
        return band(W_sw)

    def mask_bytes(self, kernel: str, act: int) -> sp.Expr:
        return T * T if kernel == "naive" else act * T * T

    def mask_kernels(self, kernel: str) -> int:
        return 4 if kernel == "naive" else 6

    def cached_keys(self) -> sp.Expr:
        """Tokens a local layer caches per sequence at context T: the last W (vLLM and
        SGLang free the blocks that slide out of the window)."""
        return smin(T, W_sw)


WINDOW = Window()
