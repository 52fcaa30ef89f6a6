"""The FFN-kind protocol and a model's mix of FFN blocks.

Each kind answers for one block (and, where stated, one token): its parameters and FLOPs by
op, what its backward keeps, what its eager elementwise ops move and the kernels they
dispatch, its GEMMs on a device, and what expert parallelism splits. A model's blocks are
a mix of kinds with counts (:func:`blocks`): dense FFNs in every block, or an MoE model's
``dense_layers`` leading dense blocks (L_d) below its MoE blocks (L - L_d). Callers sum or
scale over the mix; no caller branches on a kind. Adding a kind is one module plus its
entry in ``KINDS`` and in :func:`structure`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from costmodel.kinds.ffn.dense import DENSE
from costmodel.kinds.ffn.moe import MOE
from costmodel.specs.model import ModelSpec
from costmodel.symbols.core import L, L_d
from costmodel.symbols.ops import add, integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

Gemm = tuple[Any, Any, Any, Any]
"""(rows per token, k, n2, how many) of one kind of matmul in an op."""


class FFNKind(Protocol):
    """One FFN kind, per block (and per token where a method says so)."""

    name: str
    ops: tuple[str, ...]
    """Its ops in parameter, FLOP and GEMM breakdowns."""
    kept_parts: tuple[str, ...]
    """Its parts of ``activation_memory`` (beside the FFN's input)."""
    routes: bool
    """Whether a token runs only some of its parameters (a router chooses them)."""
    field: str | None
    """The ModelSpec field that selects it (None: the default kind)."""
    title: str
    """How errors name it."""
    offload: bool
    """Whether offload plans are modelled for its blocks."""
    grouped_ops: tuple[str, ...]
    """Its ops whose matmuls run as grouped GEMMs (one problem per expert): where a grouped
    linear loops over the experts on the host, at ``efficiency.grouped`` of a dense GEMM's
    efficiency (``costmodel.parallel.gemms``)."""

    def params(self, model: ModelSpec) -> dict[str, sp.Expr]:
        """One block's parameters by op (biases included)."""
        ...

    def unused(self, model: ModelSpec) -> sp.Expr:
        """One block's parameters a token does not run through."""
        ...

    def routed(self, model: ModelSpec) -> tuple[sp.Expr, sp.Expr]:
        """(parameters, matmul weights) of one block's that expert parallelism splits."""
        ...

    def matmul_weights(self, model: ModelSpec) -> sp.Expr:
        """One block's weights that enter a matmul (biases excluded)."""
        ...

    def weight_matrices(self, model: ModelSpec) -> list[tuple[sp.Expr, sp.Expr]]:
        """One block's two-dimensional parameters as (how many, elements each)."""
        ...

    def forward_flops(self, model: ModelSpec) -> dict[str, sp.Expr]:
        """Forward matmul FLOPs per token by op."""
        ...

    def hidden_width(self, model: ModelSpec) -> sp.Expr:
        """Hidden width per token of its backward, one FFN at a time."""
        ...

    def kept(self, model: ModelSpec, act: int, mm: int) -> dict[str, sp.Expr]:
        """Bytes per token kept for backward by part (``kept_parts``)."""
        ...

    def kept_scales(
        self, model: ModelSpec, act: int, mm: int, weighted: bool = True
    ) -> dict[str, sp.Expr]:
        """Multipliers of its parts on the busiest rank of an expert-parallel group (and
        of what its expert tensor-parallel ranks gather), beside the 1/tp every part
        takes under sequence parallelism; ``weighted``: the framework's combine keeps the
        weighted output beside the expert's (``Traits.combine_keeps_weighted``)."""
        ...

    def moved(self, model: ModelSpec, a: int) -> tuple[sp.Expr, sp.Expr]:
        """(forward, backward) eager elementwise bytes per token."""
        ...

    def bias_outputs(self, model: ModelSpec) -> sp.Expr:
        """Output features per token whose bias gradients backward sums."""
        ...

    def input_consumers(self, model: ModelSpec) -> int:
        """Matmuls beyond the first reading the FFN input in ``moved``'s accounting."""
        ...

    def eager_kernels(self, model: ModelSpec, prec: Any) -> tuple[Any, Any]:
        """(forward, backward) kernels in eager mode."""
        ...

    def fused_kernels(self, model: ModelSpec) -> tuple[Any, Any]:
        """(forward, backward) kernels beyond the block's matmuls with fused regions."""
        ...

    def graphed_kernels(self, model: ModelSpec) -> tuple[Any, Any, int]:
        """(forward, backward) kernels with fused regions that a partial CUDA graph captures
        beyond the attention's, and the graphs they form per pass."""
        ...

    def gemms(self, model: ModelSpec) -> dict[str, list[Gemm]]:
        """One device's matmuls by op as (rows per token, k, n2, how many)."""
        ...


KINDS: dict[str, FFNKind] = {kind.name: kind for kind in (DENSE, MOE)}
"""Name -> kind."""


def structure(model: Any) -> tuple[str, ...]:
    """The FFN kinds a model's blocks have, bottom first (part of the structure key)."""
    return ("dense", "moe") if model.n_experts > 0 else ("dense",)


def placeholder(kinds: tuple[str, ...], flags: dict[str, Any]) -> dict[str, int]:
    """ModelSpec sizes that give a structure's FFN kinds (sizes are symbols): an MoE
    model's experts (and a shared expert where its gate needs one)."""
    if "moe" not in kinds:
        return {}
    return {"n_experts": 2, "experts_per_token": 1,
            "n_shared_experts": int(flags["shared_expert_gate"])}  # fmt: skip


def blocks(model: Any) -> list[tuple[FFNKind, sp.Expr]]:
    """(kind, blocks of that kind): L dense blocks, or L_d dense and L - L_d MoE ones."""
    kinds = structure(model)
    if len(kinds) == 1:
        return [(KINDS[kinds[0]], L)]
    return [(KINDS["dense"], L_d), (KINDS["moe"], L - L_d)]


def top(model: Any) -> FFNKind:
    """The kind of the top block (an MoE model's: MoE, its largest block too)."""
    return blocks(model)[-1][0]


def total(model: Any, quantity: Callable[[FFNKind], Any]) -> sp.Expr:
    """A per-block quantity summed over the model's blocks."""
    return add(*(count * quantity(kind) for kind, count in blocks(model)))


def by_op(model: Any, quantity: Callable[[FFNKind], dict[str, sp.Expr]]) -> dict[str, sp.Expr]:
    """A per-block breakdown by op, each op summed over the blocks that have it."""
    out: dict[str, sp.Expr] = {}
    for kind, count in blocks(model):
        for op, expr in quantity(kind).items():
            out[op] = out.get(op, integer(0)) + count * expr
    return out


def routes(model: Any) -> bool:
    """Whether some block routes its tokens (the model's active parameters are fewer)."""
    return any(kind.routes for kind, _ in blocks(model))


def ops(model: Any) -> tuple[str, ...]:
    """Every FFN op of the model's blocks."""
    return tuple(op for kind, _ in blocks(model) for op in kind.ops)


def grouped_ops(model: Any) -> tuple[str, ...]:
    """The FFN ops of the model's blocks that run as grouped GEMMs (``FFNKind.grouped_ops``)."""
    return tuple(op for kind, _ in blocks(model) for op in kind.grouped_ops)
