"""Activations one device keeps under TP (+SP), PP, CP and EP, by framework: what each
part of ``single.memory.activation_memory`` becomes on a device (split over tp where the
layout shards it, per layer-micro-batch held under pipelining, the MoE and dense FFN parts
over their own blocks), and the buffers frameworks keep beside it.

Sources: tensor and sequence parallel activations (Korthikanti et al. 2022, Table 2:
sbh(10 + 24/t + 5as/ht) without SP, all /t with SP); pipeline ranks
(``costmodel.parallel.pipeline``). Bytes, in terms of the global micro-batch b and T.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds import attention, ffn
from costmodel.parallel.pipeline import (
    PipelineRank,
    boundary_tensors,
    chunks_in_flight,
    held_layers,
    in_flight_per_stage,
)
from costmodel.parallel.shares import device_blocks, residual_bytes, stage_layers
from costmodel.single.memory import (
    HEAD_PARTS,
    SHARED_PARTS,
    activation_memory,
)
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import traits_of
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.algebra import shared
from costmodel.symbols.core import (
    D,
    L,
    N_cp,
    T,
    V,
    Y,
    b,
    more_than_one,
)
from costmodel.symbols.ops import add, integer, smax

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

_TP_SHARDED = ("attention", "qk_norm", "attn_out_input", "ffn_hidden", "loss", "matmul_outputs")
_TP_PARTIAL = ("row_outputs",)  # D-wide partial sums before the reduce, on every TP rank
# column-parallel matmul inputs: under sequence parallelism DTensor (torch's TP styles) saves
# the all-gathered input; Megatron saves its sequence shard and gathers again in backward
_SP_GATHERED = ("attn_input", "ffn_input", "lm_head_input")


@shared
def sharded_activations(
    model: ModelSpec,
    train: TrainSpec,
    par: ParallelSpec,
    *,
    only: tuple[str, ...] | None = None,
    rank: PipelineRank | None = None,
) -> sp.Expr:
    """Activations one device keeps, in terms of the global micro-batch b and T.

    With pipeline ``rank``: what that rank keeps at its fullest
    (:func:`costmodel.parallel.pipeline.held_layers`: its layers times the micro-batches
    in flight, the head's parts on the last rank, and the stage-boundary tensors a
    pipelining runtime keeps beyond them,
    :func:`costmodel.parallel.pipeline.boundary_tensors`). Otherwise one micro-batch through
    the device's layers (without pp, all of them: what a forward pass writes).
    ``only``: the sum over these parts of ``activation_memory`` alone (the embedding's
    DTensor buffers count with ``inputs``)."""
    res = residual_bytes(train, par)
    parts = activation_memory(model, train, residual=res)
    parts.pop("total")
    if only is not None:
        parts = {op: e for op, e in parts.items() if op in only}
    if rank is not None:
        held = held_layers(par, rank)
        micro_batches = in_flight_per_stage(par, rank) * int(rank.first)
    else:  # the busiest stage's layers, L without pp
        held, micro_batches = stage_layers(par), 1
    shares = _layer_shares(model, held, device_blocks(model, par, rank))
    ep_scales = _kept_scales(model, train, traits_of(par).combine_keeps_weighted)
    head = 1 if rank is None or rank.last else 0
    total = integer(0)
    framework = traits_of(par)
    dtensor = framework.dtensor_tp
    for op, expr in parts.items():
        if op in SHARED_PARTS:  # the reference model makes its tables in every forward
            again = op in ("rope", "attn_mask") and rank is not None
            again = again and framework.rebuilds_tables  # (torchtitan keeps freqs_cis)
            total += expr * (chunks_in_flight(par, rank) if again else 1)
            continue
        sequence = par.sequence_parallel and not (dtensor and op in _SP_GATHERED)
        sharded = op not in _TP_PARTIAL and (sequence or op in _TP_SHARDED)
        scale = head if op in HEAD_PARTS else shares.get(op, shares["all"])
        if op in ep_scales:  # an FFN kind's parts on the busiest ep rank
            scale *= ep_scales[op]
        total += expr / (Y if sharded else 1) * scale
    if rank is not None and only is None:
        total += boundary_tensors(par, rank)[1] * stage_boundary(train, par)
        if rank.last and not model.ffn_only and framework.torch_pipelining:
            # the last stage's output is the logits, kept to its backward like any other
            total += PRECISIONS[train.precision].activation * b * T * V / Y
    if only is not None and "inputs" not in only:
        return total
    return total + micro_batches * dtensor_embedding_buffers(model, train, par)


def _kept_scales(model: ModelSpec, train: TrainSpec, weighted: bool) -> dict[str, sp.Expr]:
    """Each FFN kind's multipliers of its parts (``FFNKind.kept_scales``); ``weighted``:
    the framework's combine keeps the weighted output (``Traits.combine_keeps_weighted``)."""
    prec = PRECISIONS[train.precision]
    sizes = (model, prec.activation, prec.matmul_input)
    return {k: e for kind, _ in ffn.blocks(model)
            for k, e in kind.kept_scales(*sizes, weighted).items()}  # fmt: skip


def _layer_shares(
    model: ModelSpec, held: sp.Expr, device: list[tuple[Any, sp.Expr]]
) -> dict[str, sp.Expr]:
    """Multipliers of ``activation_memory``'s parts (each summed over the blocks that have
    it) for ``held`` layer-micro-batches of the ``device``'s blocks (FFN kind, how many):
    ``all`` for what every block keeps, each FFN kind's parts over its own blocks (max(..,
    1): a part over no blocks is 0 whatever multiplies it)."""
    shares = {"all": held / L}
    if len(device) == 1:  # one kind: its parts are in every block
        return shares
    layers = add(*(n for _, n in device))
    for (kind, count), (_, mine) in zip(ffn.blocks(model), device, strict=True):
        shares.update(dict.fromkeys(kind.kept_parts, held * mine / layers / smax(count, 1)))
    return shares


def ring_transient(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Bytes ring attention holds in a layer's backward beside the activations, in terms of
    b and T (0 without cp): the fp32 query-gradient accumulator, the fp32 K/V gradient
    accumulators of the chunk in hand and of the one arriving, the K/V chunk arriving
    and one block's gradients in the compute dtype (torch's context_parallel backward
    allocates the same, plus its send buffers; measured on the hand-written ring,
    ``validate.distributed.context``)."""
    if model.ffn_only:
        return integer(0)
    c = PRECISIONS[train.precision].activation
    q, key, value = attention.projections(model).ring_widths(model, train.attention)
    kv = key + value
    per_token = (4 * q + 8 * kv + c * kv + c * (q + kv)) / Y
    return more_than_one(N_cp) * per_token * b * T


def stage_boundary(train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Bytes of one micro-batch's activation between two pipeline stages (the residual
    stream; a sequence shard of it under sequence parallelism), in terms of b and T."""
    return residual_bytes(train, par) * b * T * D / (Y if par.sequence_parallel else 1)


def dtensor_embedding_buffers(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Bytes torch's vocabulary-parallel embedding (``RowwiseParallel`` on ``nn.Embedding``)
    keeps per micro-batch from forward to backward beyond what autograd saves, in the
    residual dtype: the masked partial lookup and its all-reduced copy (2 x b·T·D), or
    under sequence parallelism three b·T·D / tp sequence shards (the reduce-scatter's
    output and its re-wrapped copies). Measured on torch 2.13 (``validate.run --suite
    parallel``, layouts tp and tp-sp); Megatron's VocabParallelEmbedding reduces in place (none).
    In terms of the micro-batch's b sequences of T tokens, as :func:`sharded_activations`."""
    if model.ffn_only or not traits_of(par).dtensor_tp:
        return integer(0)
    copies = 3 / Y if par.sequence_parallel else 2  # in terms of the global micro-batch b
    return more_than_one(Y) * copies * residual_bytes(train, par) * b * T * D  # and T, as
    # the rest of sharded_activations (its callers divide both over the device's share)
