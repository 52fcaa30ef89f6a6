"""Primitives every kind's byte and kernel counts use: what a dtype cast costs, what a
norm keeps.

Eager PyTorch runs ``.to(dtype)`` as a copy kernel (read n, write n elements) only where the
dtype changes; otherwise it returns the tensor itself and dispatches nothing. Units: bytes
per element size, kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

STAT = 4
"""Bytes of the fp32 statistics norms, softmax and routers compute in."""
INDEX_BYTES = 8
"""int64 indices: token ids, targets, positions, top-k choices, gathers."""


def norm_kept(norm: str, nbytes: int, width: Any) -> Any:
    """Bytes a fused norm keeps for backward per normalised row: its input (``width``
    elements of ``nbytes``) and its fp32 statistics, rstd (and the mean for LayerNorm)."""
    return nbytes * width + STAT * (1 if norm == "rmsnorm" else 2)


def cast_bytes(src: int, dst: int, n: sp.Expr) -> sp.Expr:
    """``.to(dtype)`` reads and writes n elements, or dispatches nothing if the dtype holds."""
    return (src + dst) * n if src != dst else integer(0)


def differ(a: int, b: int) -> int:
    """A ``.to(dtype)`` dispatches a copy only where the dtype changes."""
    return int(a != b)
