"""Expert parallelism's share of a device: which routed experts it holds, over how many
devices their state is sharded and replicated, and how many routed pairs its experts run.

Each rank of an ep group holds ``n_experts / ep`` of every MoE block's routed experts
(GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2022, Sec. 2.2). The ep
ranks are data-parallel ranks, taken from the ZeRO shard group first (torchtitan's ep
mesh within dp_shard x cp; Megatron-LM's expert-data-parallel group within the
data-parallel ranks), so a routed expert's state is sharded over the shard group's ranks
outside its ep group and replicated over the replicas the ep group leaves. Parameters and
bytes per device; a dense model has no routed experts (every term here is 0 or 1 then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds import ffn
from costmodel.kinds.ffn.moe import busiest_experts, dropped_fraction, kept_fraction
from costmodel.single.memory import kept_weight_copies, state_memory
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.core import N_ep, N_etp, Y, as_expr, smin
from costmodel.symbols.ops import add, integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

__all__ = ["busiest_experts", "dropped_fraction", "expert_block", "expert_group_ranks",
           "expert_replicas", "expert_shards", "kept_fraction", "local_experts", "sharded_params",
           "split_state"]  # fmt: skip


def expert_block(model: ModelSpec) -> tuple[sp.Expr, sp.Expr]:
    """(parameters, matmul weights) of the top block's routed experts (0 for a dense
    model): what expert parallelism splits over its ranks."""
    return ffn.top(model).routed(model)


def local_experts(model: ModelSpec, blocks: list[tuple[Any, sp.Expr]]) -> tuple[sp.Expr, sp.Expr]:
    """(parameters, matmul weights) of the routed experts a device holding ``blocks`` (FFN
    kind, how many) keeps before ZeRO: n_experts / ep of each routed block's."""
    routed = [[n * e / N_ep for e in kind.routed(model)] for kind, n in blocks]
    return add(*(r[0] for r in routed)), add(*(r[1] for r in routed))


def expert_group_ranks() -> sp.Expr:
    """Data-parallel ranks one expert group (etp x ep devices) takes: ep·etp/tp. The expert
    layers' mesh spans the same devices as the dense layers' tp x data-parallel ranks
    (Megatron-Core's expert tensor, expert and expert-data parallel groups); with etp =
    tp, the default, it is ep: the ep ranks are data-parallel ranks."""
    return N_ep * N_etp / Y


def expert_shards(shards: sp.Expr) -> sp.Expr:
    """Devices a routed expert's share of some state is split over, where the dense
    parameters' is split over ``shards`` devices: the expert group's data-parallel ranks
    (:func:`expert_group_ranks`) are taken from that group first (torchtitan carves ep
    from dp_shard x cp, Megatron its expert-data-parallel group from the data-parallel
    ranks), and those ranks hold other experts, not other shards of these. ``min(ranks,
    shards)`` of them are the group's (the layout rule makes the ranks divide the group
    or be a multiple of it)."""
    return shards / smin(expert_group_ranks(), shards)


def expert_replicas(shards: sp.Expr, replicas: sp.Expr) -> sp.Expr:
    """Devices holding the same shard of a routed expert, where a dense parameter's shard
    is on ``replicas`` devices of ``shards``-device groups: the replicas the expert group
    does not take (its ranks beyond the shard group come from the replicas)."""
    ranks = expert_group_ranks()
    return replicas * smin(ranks, shards) / ranks


def sharded_params(model: ModelSpec, n: sp.Expr, shards: sp.Expr, experts: sp.Expr) -> sp.Expr:
    """Parameters per device of the ``n`` a device holds before ZeRO (``experts`` of them
    routed experts), their state split over ``shards`` devices: the routed experts over
    :func:`expert_shards` of them."""
    return (n - experts) / shards + experts / expert_shards(shards)


def split_state(
    model: ModelSpec,
    train: TrainSpec,
    n: sp.Expr,
    kept: sp.Expr,
    shards: tuple,
    experts: tuple[sp.Expr, sp.Expr],
) -> dict[str, sp.Expr]:
    """``state_memory`` of a device's ``n`` parameters (``kept`` weight casts) with the
    dense ones' state split over ``shards`` and the routed experts' (``experts``: their
    parameters and matmul weights on the device) over theirs."""
    if not ffn.routes(model):  # (a dense model's frozen weights are counted once)
        return state_memory(model, train, params=n, kept_copies=kept, shards=shards)
    routed, routed_mm = experts
    routed_kept = kept_weight_copies(model, train, matmul=routed_mm, head=integer(0))
    dense = state_memory(model, train, params=n - routed, kept_copies=kept - routed_kept,
                         shards=shards)  # fmt: skip
    mine = state_memory(model, train, params=routed, kept_copies=routed_kept,
                        shards=tuple(expert_shards(as_expr(s)) for s in shards))  # fmt: skip
    return {k: dense[k] + mine[k] for k in dense}
