"""What one device's share of a layout is: its micro-batch, its stage's blocks by FFN kind
(``costmodel.kinds.ffn``) and routed experts, the groups its state is sharded and replicated over,
and the residual stream's dtype its framework keeps. Shared by per-device memory
(``costmodel.parallel.distributed``), activations (``costmodel.parallel.activations``),
communication and timing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.kinds import ffn
from costmodel.parallel.experts import local_experts
from costmodel.parallel.pipeline import (
    PipelineRank,
    leading_layers,
    rank_layers,
    slots,
    stages_held,
)
from costmodel.single import finetune
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import traits_of
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.algebra import shared
from costmodel.symbols.core import (
    L,
    N_cp,
    N_dp,
    N_etp,
    N_pp,
    T,
    X,
    b,
    sceil,
)
from costmodel.symbols.ops import add, integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def device_batch() -> tuple[sp.Expr, sp.Expr]:
    """(sequences, tokens per sequence) one device handles per micro-batch."""
    return b / (N_dp * X), T / N_cp


@shared
def stage_layers(par: ParallelSpec) -> sp.Expr:
    """Layers on the busiest pipeline stage: ceil(S / pp) of the S slots the split divides
    (``pipeline.slots``; torchtitan and Megatron accept uneven splits, e.g. Llama-3 405B's
    126 layers over 8 stages)."""
    return sceil(slots(par)[2] / N_pp) if par.pp > 1 else L


@shared
def device_blocks(
    model: ModelSpec, par: ParallelSpec, rank: PipelineRank | None = None
) -> list[tuple[ffn.FFNKind, sp.Expr]]:
    """(FFN kind, blocks of that kind) a device holds, in the model's mix
    (``costmodel.kinds.ffn.blocks``): all of them without pp. The mix's lower kinds (an
    MoE model's leading dense blocks) are the model's first blocks, on the stages that hold
    them (``pipeline.leading_layers``), the top kind fills the rest: on pipeline ``rank``
    its blocks but those; without a rank, with pp > 1, the busiest stage's blocks, all of
    the top kind (an upper bound)."""
    mix = ffn.blocks(model)
    *lower, (top, _) = mix
    if rank is not None:
        held, below = [], integer(0)
        for kind, n in lower:  # each lower kind's blocks follow the kinds below it
            mine = leading_layers(par, rank, below + n) - leading_layers(par, rank, below)
            held.append((kind, mine))
            below += n
        return [*held, (top, rank_layers(par, rank) - add(*(n for _, n in held)))]
    if par.pp > 1:
        return [*((kind, integer(0)) for kind, _ in lower), (top, stage_layers(par))]
    return mix


def routed_blocks(model: ModelSpec, par: ParallelSpec, rank: PipelineRank | None = None) -> sp.Expr:
    """Blocks a device holds whose FFN routes tokens (MoE blocks; 0 for a dense model)."""
    return add(*(n for kind, n in device_blocks(model, par, rank) if kind.routes))


def device_experts(
    model: ModelSpec, par: ParallelSpec, rank: PipelineRank | None = None
) -> tuple[sp.Expr, sp.Expr]:
    """(parameters, matmul weights) of the routed experts a device holds before ZeRO: its
    ep rank's share, split over the expert tensor-parallel ranks (etp); without a rank,
    the busiest stage's, twice under DualPipe (a rank holds a stage of each direction)."""
    copies = stages_held(par) if rank is None else 1
    return tuple(copies * e / N_etp for e in local_experts(model, device_blocks(model, par, rank)))


def shard_degree(par: ParallelSpec) -> sp.Expr:
    """Devices one ZeRO/FSDP shard group spans: fsdp, times cp where the framework shards
    over the context-parallel ranks too (FSDP2 in torchtitan: the dp_shard x cp mesh)."""
    return X * N_cp if traits_of(par).shards_over_cp else X


def replicas(par: ParallelSpec) -> sp.Expr:
    """Devices whose gradients of the same parameter shard the data-parallel all-reduce
    sums: dp, times cp where the framework does not shard over the cp ranks (they hold
    the same parameters and see different chunks of the sequences: Megatron reduces over
    its dp x cp group, ``get_data_parallel_group(with_context_parallel=True)``)."""
    return N_dp if traits_of(par).shards_over_cp else N_dp * N_cp


def optimizer_shards(par: ParallelSpec) -> sp.Expr:
    """Devices the optimizer state is split over: the ZeRO group (fsdp, x cp under FSDP2),
    or every data-parallel rank (x cp) under Megatron's distributed optimizer."""
    return replicas(par) * X if traits_of(par).distributed_optimizer else shard_degree(par)


def residual_bytes(train: TrainSpec, par: ParallelSpec) -> int:
    """Residual stream and norm inputs: fp32 under torch.autocast (the reference model),
    the compute dtype where the framework runs the model in it (FSDP2's param_dtype,
    Megatron without --fp32-residual-connection, DeepSpeed's bf16 engine)."""
    prec = PRECISIONS[train.precision]
    return finetune.residual(train) if traits_of(par).autocast else prec.activation
