"""What one device holds of the training state before and after sharding: its share of the
parameters (stage, tp, experts), ZeRO's shards, and torch.autocast's state, the default a
framework builds on (``costmodel.frameworks``). Bytes or elements per device, as stated.

Sources: ZeRO stages (Rajbhandari et al. 2020, Sec. 5); vocabulary-parallel matrices and
tp-split blocks (Shoeybi et al. 2019, Sec. 3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from costmodel.kinds import attention
from costmodel.parallel.experts import local_experts, sharded_params, split_state
from costmodel.parallel.pipeline import PipelineRank, in_flight_per_stage, rank_layers, stages_held
from costmodel.parallel.shares import device_blocks, device_experts, stage_layers
from costmodel.single import finetune
from costmodel.single.memory import kept_weight_copies
from costmodel.single.params import block_params, param_breakdown, stacked_blocks
from costmodel.single.precision import PRECISIONS, optimizer_state_bytes
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.algebra import shared
from costmodel.symbols.core import D, L, N_ep, N_etp, N_pp, V, X, Y, smax
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


@shared
def params_per_device(
    model: ModelSpec, par: ParallelSpec, rank: PipelineRank | None = None
) -> tuple[sp.Expr, sp.Expr]:
    """(all, matmul-weight) parameters one device holds before ZeRO: blocks of one stage
    split over tp (norms and MLA's down-projections whole on every rank), vocabulary
    matrices split over tp (vocab-parallel).
    ``rank``: that pipeline rank's exactly (its layers, the embedding on the first, the
    final norm and head on the last); without it, with pp > 1, the busiest stage's layers
    with the larger of the embedding and the head (an upper bound for every rank); under
    DualPipe two stages' layers and both (an end rank's)."""
    parts = param_breakdown(model)
    block = block_params(model, norms=False)
    norm_total = parts["norms"]
    vocab_in = parts["embedding"] + parts["pos_embedding"]
    head = parts["lm_head"]
    head_mm = 0 if model.ffn_only else V * D
    layers = rank_layers(par, rank) if rank is not None else stage_layers(par)
    held = device_blocks(model, par, rank)
    blocks, blocks_mm = stacked_blocks(model, held)
    # the dense parts split over tp; the routed experts: the ep rank's share over etp
    local = local_experts(model, held)
    pairs = zip((blocks, blocks_mm), local, strict=True)
    blocks, blocks_mm = (whole - N_ep * mine + Y * mine / N_etp for whole, mine in pairs)
    # what every tp rank holds whole (MLA's down-projections), in Y/Y of its share
    whole = 0 if model.ffn_only else layers * attention.projections(model).duplicated(model)
    blocks, blocks_mm = blocks + (Y - 1) * whole, blocks_mm + (Y - 1) * whole
    if rank is not None:
        block_norms = block_params(model, norms=True) - block
        final_norm = norm_total - L * block_norms
        ends = (vocab_in if rank.first else 0) + (head if rank.last else 0)
        total = blocks / Y + layers * block_norms + ends / Y + (final_norm if rank.last else 0)
        return total, blocks_mm / Y + (head_mm / Y if rank.last else 0)
    copies = stages_held(par)
    vocab = smax(vocab_in, head) if par.pp > 1 and copies == 1 else vocab_in + head
    total = copies * (blocks / Y + norm_total / (N_pp if par.pp > 1 else 1)) + vocab / Y
    return total, copies * blocks_mm / Y + head_mm / Y


def trained_per_device(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Parameters with gradients and optimizer state one device holds before ZeRO: its
    share of the model (:func:`params_per_device`), or when fine-tuning the adapters (data
    parallelism and ZeRO alone, ``finetune_rule``: every device holds them all)."""
    if finetune.tunes(train):
        return finetune.trainable_params(model, train)
    return params_per_device(model, par)[0]


def zero_shards(par: ParallelSpec) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """What ZeRO divides over the fsdp group X: (parameters, gradients, optimizer state),
    by stage (Rajbhandari et al. 2020, Sec. 5)."""
    return (X if par.zero == 3 else 1, X if par.zero >= 2 else 1, X)


def replicated_embedding_grad(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Bytes beyond its shard of the vocabulary-parallel embedding's gradient under torch's
    tensor parallelism: DTensor's embedding backward yields the whole V x D gradient,
    replicated on every tp rank, which ``.grad`` keeps until the optimizer slices it
    (measured on torch 2.13, ``validate.run --suite parallel``, layouts tp and tp-sp).
    The reference framework holds it; FSDP2 reduce-scatters it, Megatron's
    VocabParallelEmbedding computes its own rows only."""
    if model.ffn_only:
        return integer(0)
    return PRECISIONS[train.precision].grad * V * D * (1 - 1 / Y)


def autocast_state(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
) -> dict[str, sp.Expr]:
    """torch.autocast's state (fp32 parameters, kept low-precision weight casts) under
    ZeRO over X (Rajbhandari et al. 2020, Sec. 5); under pp the casts are made again for
    each micro-batch in flight and each keeps its own to backward."""
    n, n_mm = params_per_device(model, par, rank)
    head = None if model.ffn_only else V * D / Y * int(rank is None or rank.last)
    kept = kept_weight_copies(model, train, matmul=n_mm, head=head)
    if rank is not None and par.pp > 1:
        kept *= in_flight_per_stage(par, rank)
    shards = zero_shards(par)
    state = split_state(model, train, n, kept, shards, device_experts(model, par, rank))
    if rank is None or rank.first:
        state["grads"] += replicated_embedding_grad(model, train) / shards[1]
    return state


def shard_of(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
) -> tuple[sp.Expr, Callable[[sp.Expr], sp.Expr], Callable[[sp.Expr], sp.Expr]]:
    """(parameters before sharding, parameters per shard of a group, optimizer bytes per
    shard of a group): a group of ``shards`` devices splits the dense parameters, the
    routed experts over their own group (:func:`~costmodel.parallel.experts.sharded_params`)."""
    n, _ = params_per_device(model, par, rank)
    routed, _ = device_experts(model, par, rank)

    def per_shard(shards: sp.Expr) -> sp.Expr:
        return sharded_params(model, n, shards, routed)

    def opt(shards: sp.Expr) -> sp.Expr:
        return optimizer_state_bytes(train.optimizer, train.precision, per_shard(shards))

    return n, per_shard, opt
