"""What one device's share of a layout is: its micro-batch, its stage's blocks (MoE ones
counted apart) and routed experts, the groups its state is sharded and replicated over,
and the residual stream's dtype its framework keeps. Shared by per-device memory
(``costmodel.parallel.distributed``), activations (``costmodel.parallel.activations``),
communication and timing.
"""

import sympy as sp

from costmodel.frameworks.registry import framework_of
from costmodel.parallel.experts import (
    local_experts,
)
from costmodel.parallel.pipeline import (
    PipelineRank,
    rank_layers,
)
from costmodel.single import finetune
from costmodel.single.params import (
    moe_layers,
)
from costmodel.single.precision import PRECISIONS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols import (
    L,
    L_d,
    N_cp,
    N_dp,
    N_pp,
    T,
    X,
    b,
)


def device_batch() -> tuple[sp.Expr, sp.Expr]:
    """(sequences, tokens per sequence) one device handles per micro-batch."""
    return b / (N_dp * X), T / N_cp


def stage_layers(par: ParallelSpec) -> sp.Expr:
    """Layers on the busiest pipeline stage: ceil(L / pp) (torchtitan and Megatron accept
    uneven splits, e.g. Llama-3 405B's 126 layers over 8 stages)."""
    return sp.ceiling(L / N_pp) if par.pp > 1 else L


def moe_blocks(model: ModelSpec, par: ParallelSpec, rank: PipelineRank | None = None) -> sp.Expr:
    """MoE blocks a device holds: all of them without pp; on pipeline ``rank`` its blocks
    but the dense leading ones, which the first stage holds (a layout rule); without a
    rank, with pp > 1, the busiest stage's blocks, all MoE blocks (an upper bound)."""
    if not model.moe:
        return sp.Integer(0)
    if rank is not None:
        return rank_layers(par, rank) - (L_d if rank.first else 0)
    return stage_layers(par) if par.pp > 1 else moe_layers(model)


def device_experts(
    model: ModelSpec, par: ParallelSpec, rank: PipelineRank | None = None
) -> tuple[sp.Expr, sp.Expr]:
    """(parameters, matmul weights) of the routed experts a device holds before ZeRO."""
    return local_experts(model, moe_blocks(model, par, rank))


def shard_degree(par: ParallelSpec) -> sp.Expr:
    """Devices one ZeRO/FSDP shard group spans: fsdp, times cp where the framework shards
    over the context-parallel ranks too (FSDP2 in torchtitan: the dp_shard x cp mesh)."""
    return X * N_cp if framework_of(par).shards_over_cp else X


def replicas(par: ParallelSpec) -> sp.Expr:
    """Devices whose gradients of the same parameter shard the data-parallel all-reduce
    sums: dp, times cp where the framework does not shard over the cp ranks (they hold
    the same parameters and see different chunks of the sequences: Megatron reduces over
    its dp x cp group, ``get_data_parallel_group(with_context_parallel=True)``)."""
    return N_dp if framework_of(par).shards_over_cp else N_dp * N_cp


def optimizer_shards(par: ParallelSpec) -> sp.Expr:
    """Devices the optimizer state is split over: the ZeRO group (fsdp, x cp under FSDP2),
    or every data-parallel rank (x cp) under Megatron's distributed optimizer."""
    return replicas(par) * X if framework_of(par).distributed_optimizer else shard_degree(par)


def residual_bytes(train: TrainSpec, par: ParallelSpec) -> int:
    """Residual stream and norm inputs: fp32 under torch.autocast (the reference model),
    the compute dtype where the framework runs the model in it (FSDP2's param_dtype,
    Megatron without --fp32-residual-connection, DeepSpeed's bf16 engine)."""
    prec = PRECISIONS[train.precision]
    return finetune.residual(train) if framework_of(par).autocast else prec.activation
