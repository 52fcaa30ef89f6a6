"""The attention-core protocol and a model's mix of kinds.

Each kind answers for one layer, one head and one sequence of T tokens (sympy, over
``costmodel.symbols``): the query-key pairs a fused kernel computes, those a naive kernel
computes (the dense T x T), the useful (unmasked) ones, and the mask the reference model
keeps for it (``validate/reference/core.py``), bytes and kernels. A model's layers are a
mix of kinds with counts (``layer_counts``): full causal attention on every layer, or with
a sliding window local layers (``L_loc`` of them) beside global ones. What differs between
layers is asked of their kind here; no caller branches on a kind. FLOPs as torch's
FlopCounterMode counts them stay dense whatever the kind (it counts SDPA with a mask, and
the naive kernel's matmuls, over all T x T pairs): ``costmodel.single.flops``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from costmodel.kinds.attention.causal import CAUSAL
from costmodel.kinds.attention.window import WINDOW
from costmodel.symbols.core import L, L_loc, as_expr, at_least_one
from costmodel.symbols.ops import add

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


class AttentionCore(Protocol):
    """One attention-core kind, per layer, head and sequence of T tokens."""

    name: str

    def fused_pairs(self) -> sp.Expr:
        """Query-key pairs a fused (FlashAttention-2) kernel computes, at tile granularity."""
        ...

    def naive_pairs(self) -> sp.Expr:
        """Pairs a naive kernel computes: every score of the T x T matrix."""
        ...

    def useful_pairs(self) -> sp.Expr:
        """Pairs the mask keeps (the model FLOPs' convention)."""
        ...

    def mask_bytes(self, kernel: str, act: int) -> sp.Expr:
        """Bytes of the mask the reference model keeps for backward, one for all layers of
        this kind (``act``: bytes of the compute dtype)."""
        ...

    def mask_kernels(self, kernel: str) -> int:
        """Kernels the reference model dispatches to build that mask, once per forward."""
        ...

    def cached_keys(self) -> sp.Expr:
        """Tokens one layer of this kind caches per sequence at context T for decoding."""
        ...


KINDS: dict[str, AttentionCore] = {kind.name: kind for kind in (CAUSAL, WINDOW)}
"""Name -> kind; a model's mix names its kinds (``structure``)."""


def structure(model: Any) -> tuple[str, ...]:
    """The kinds a model's layers have (part of the structure key: the expressions differ):
    full causal, all local (a window without a pattern) or both."""
    if model.sliding_window <= 0:
        return ("causal",)
    return ("causal", "window") if model.global_every else ("window",)


def placeholder(kinds: tuple[str, ...]) -> dict[str, int]:
    """ModelSpec fields that give a structure's kinds (sizes are symbols)."""
    if "window" not in kinds:
        return {}
    return {"sliding_window": 4, "global_every": 2 if "causal" in kinds else 0}


def layer_counts(model: Any) -> list[tuple[AttentionCore, sp.Expr]]:
    """(kind, layers of that kind): L of one kind, or L - L_loc global and L_loc local."""
    kinds = structure(model)
    if len(kinds) == 1:
        return [(KINDS[kinds[0]], L)]
    return [(CAUSAL, L - L_loc), (WINDOW, L_loc)]


def total(model: Any, quantity: Callable[[AttentionCore], Any]) -> sp.Expr:
    """A per-layer quantity summed over the model's layers."""
    return add(*(count * quantity(kind) for kind, count in layer_counts(model)))


def per_layer(model: Any, quantity: Callable[[AttentionCore], Any]) -> sp.Expr:
    """A per-layer quantity's mean over the model's layers (a pipeline stage is taken at
    the model's mix of kinds)."""
    return total(model, quantity) / L


def _shared(model: Any, quantity: Callable[[AttentionCore], Any]) -> sp.Expr:
    """A table every layer of a kind shares, once per kind that has layers."""
    counts = layer_counts(model)
    if len(counts) == 1:
        return as_expr(quantity(counts[0][0]))
    return add(*(at_least_one(count) * quantity(kind) for kind, count in counts))


def mask_bytes(model: Any, kernel: str, act: int) -> sp.Expr:
    """Bytes of the masks kept for backward: one per kind that keeps one."""
    return _shared(model, lambda kind: kind.mask_bytes(kernel, act))


def mask_kernels(model: Any, kernel: str) -> Any:
    """Kernels that build those masks, per forward."""
    return _shared(model, lambda kind: kind.mask_kernels(kernel))
