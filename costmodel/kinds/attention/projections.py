"""The attention-projection protocol: what surrounds the core in a block.

A projection kind answers for one block: its matrices (parameters, FLOPs, GEMM shapes on a
device), its heads' widths in the core, its extra norms, its rotary tables' width, the
core's traffic and what the block keeps for backward. Kinds: standard multi-head attention
(MHA, GQA, MQA: ``costmodel.kinds.attention.standard``) and multi-head latent attention
(MLA: ``costmodel.kinds.attention.latent``). Every layer of a model has the same
projection kind; the core's kind may differ by layer (``costmodel.kinds.attention.registry``).
Adding a kind is one module plus its entry in ``PROJECTIONS`` and in :func:`projections`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from costmodel.kinds.attention.latent import LATENT
from costmodel.kinds.attention.standard import STANDARD

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


class Projections(Protocol):
    """One attention-projection kind, per block."""

    name: str
    field: str | None
    """The ModelSpec field that selects it (None: the default kind)."""
    title: str
    """How errors name it."""
    eager: bool
    """Whether the reference model's eager op-by-op counts are modelled for it."""
    offload: bool
    """Whether offload plans are modelled for its blocks."""

    def matrices(self, model: Any) -> list[tuple[str, sp.Expr, sp.Expr]]:
        """One block's matrices in forward order as (op, fan-in, fan-out)."""
        ...

    def head_widths(self, model: Any, kernel: str) -> tuple[sp.Expr, sp.Expr]:
        """(query/key, value) width of a head in the core under ``kernel``."""
        ...

    def norm_widths(self, model: Any) -> list[sp.Expr]:
        """Widths of the norms a block has beyond its two and QK-norm's."""
        ...

    def rope_width(self, model: Any) -> sp.Expr:
        """Width of the rotary tables' rows."""
        ...

    def shapes(
        self, model: Any, sequence_parallel: bool = False
    ) -> dict[str, list[tuple[sp.Expr, sp.Expr, sp.Expr]]]:
        """Per-device (rows per token, k, n2) of each projection op's matmuls under tensor
        parallelism (with or without sequence parallelism)."""
        ...

    def gathered_width(self, model: Any) -> sp.Expr:
        """Width per token tensor parallelism gathers (or reduces) in front of a block's
        head-split matmuls: the block input's D, or the latents MLA makes first."""
        ...

    def duplicated(self, model: Any) -> sp.Expr:
        """Parameters of one block every tp rank holds whole (not split by heads)."""
        ...

    def ring_widths(self, model: Any, kernel: str) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """(query, key, value) elements per token in the core under ``kernel``, before tp."""
        ...

    def core_traffic(self, model: Any, kernel: str, b_dev: Any, t_dev: Any, a: int) -> tuple:
        """(FLOPs per query-key pair, bytes of the core's operands) on a device."""
        ...

    def kept(self, model: Any, train: Any, act: int, mm: int) -> dict[str, sp.Expr]:
        """Bytes the L blocks keep for the core and beyond the block's input and norms."""
        ...

    def cached(self, model: Any) -> sp.Expr:
        """Elements one layer caches per token for decoding on a device under tp's Y ranks."""
        ...

    def decode_widths(self, model: Any) -> tuple[sp.Expr, sp.Expr]:
        """(score, value) widths per query head of a decode step's core over the cache."""
        ...

    def split_shares(self, model: Any) -> list[Any]:
        """Per matrix of :meth:`matrices`, the share one of tp's Y ranks holds when
        serving."""
        ...


PROJECTIONS: dict[str, Projections] = {kind.name: kind for kind in (STANDARD, LATENT)}
"""Name -> kind."""


def projections(model: Any) -> Projections:
    """The model's projection kind: latent where ``kv_lora_rank`` > 0."""
    return LATENT if model.kv_lora_rank > 0 else STANDARD


def placeholder(name: str, q_lora: bool) -> dict[str, int]:
    """ModelSpec sizes that give a structure's projection kind (sizes are symbols)."""
    if name != LATENT.name:
        return {}
    return {"kv_lora_rank": 4, "rope_head_dim": 2, "q_lora_rank": 4 * q_lora}
