"""Per-device state and memory under DP, FSDP (ZeRO 1/2/3), TP (+SP), PP, CP and EP, by
framework, and its peaks.

Sources: ZeRO stages (Rajbhandari et al. 2020, Sec. 5); what each pipeline rank holds
(``costmodel.parallel.pipeline``: 1F1B keeps pp - r micro-batches on rank r, interleaving
more; Narayanan et al. 2021). A device's shares of the layout are
``costmodel.parallel.shares``, its activations ``costmodel.parallel.activations``, its
communication ``costmodel.parallel.communication``. Bytes, per device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.kinds import ffn
from costmodel.parallel.activations import (
    ring_transient,
    sharded_activations,
    stage_boundary,
)
from costmodel.parallel.experts import (
    expert_block,
    expert_replicas,
    expert_shards,
    local_experts,
)
from costmodel.parallel.pipeline import (
    PipelineRank,
    boundary_tensors,
    grads_at_fullest,
    present,
    ranks,
    stages_held,
)
from costmodel.parallel.shares import (
    device_batch,
    device_experts,
    replicas,
    residual_bytes,
    shard_degree,
    stage_layers,
)
from costmodel.parallel.state import params_per_device, trained_per_device, zero_shards
from costmodel.single import finetune
from costmodel.single.memory import (
    peak_memory,
    state_memory,
)
from costmodel.single.params import (
    stacked_blocks,
)
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import Pricing, traits_of
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import (
    L,
    R_alloc,
    T,
    X,
    Y,
    b,
    bind,
    m,
    more_than_one,
    smax,
    smin,
)
from costmodel.symbols.ops import integer, is_zero, unevaluated

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def sharded_state(
    model: ModelSpec,
    train: TrainSpec,
    par: ParallelSpec,
    rank: PipelineRank | None = None,
    *,
    pricing: Pricing,
) -> dict[str, sp.Expr]:
    """params (working weights), master, grads, optimizer per device (on pipeline rank
    ``rank``, see :func:`~costmodel.parallel.state.params_per_device`): what the framework
    holds (``pricing.state``), or when fine-tuning the adapters' state under ZeRO (data
    parallelism and ZeRO alone, the reference model: ``costmodel.config``'s rules)."""
    if finetune.tunes(train):
        return state_memory(model, train, shards=zero_shards(par))
    return pricing.state(model, train, par, rank)


def ddp_buckets(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Bytes of torch DDP's gradient buckets on a device: one flat copy of every gradient in
    the gradient dtype, allocated when the model is wrapped and kept (``Reducer``; the
    default ``gradient_as_bucket_view=False`` copies each gradient in before its bucket's
    all-reduce and back after). The reference framework runs DDP over dp replicas when it
    does not shard (fsdp 1), and under ZeRO-1 (a sharded optimizer over DDP's replicas);
    FSDP (ZeRO-2/3), FSDP2, Megatron and DeepSpeed reduce without DDP's buckets. Under
    expert parallelism a routed expert's gradient is bucketed only where other ranks hold
    the same expert (torch DDP leaves out the parameters it is told to ignore)."""
    if not traits_of(par).ddp_buckets:
        return integer(0)
    n = trained_per_device(model, train, par)
    experts, _ = device_experts(model, par)
    grad = PRECISIONS[train.precision].grad
    if par.zero == 1:
        return grad * n * more_than_one(replicas(par) * X)
    # a routed expert's gradient is reduced only over the ranks holding that expert
    reduced = (n - experts) * more_than_one(replicas(par))
    reduced += experts * more_than_one(expert_replicas(shard_degree(par), replicas(par)))
    return grad * reduced * (1 - more_than_one(X))


def sharded_memory(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, *, pricing: Pricing
) -> dict[str, sp.Expr]:
    """Per-device memory by component and its peak: with pp > 1 each the maximum over the
    pipeline ranks that bound every rank (:func:`costmodel.parallel.pipeline.ranks`).
    ``pricing``: the layout's framework (``costmodel.frameworks.framework_of``)."""
    if par.pp == 1:
        return rank_memory(model, train, par, pricing=pricing)
    per_rank = [(present(r), rank_memory(model, train, par, r, pricing=pricing))
                for r in ranks(par)]  # fmt: skip
    return {k: smax(*(w * d[k] for w, d in per_rank)) for k in per_rank[0][1]}


def rank_memory(
    model: ModelSpec,
    train: TrainSpec,
    par: ParallelSpec,
    rank: PipelineRank | None = None,
    *,
    pricing: Pricing,
) -> dict[str, sp.Expr]:
    """One device's memory by component and its peak (same estimate as one device, plus
    ZeRO-3's two gathered layers in flight (one on a stage of one layer), gradients held
    through the step, and as ``buffers`` DDP's gradient buckets and a pipelining runtime's
    receive buffers); ``rank``: the pipeline rank it is (none without pp)."""
    per_device = dict(zip((b, T), device_batch(), strict=True))
    gathered = zero3_gathered(model, train, par)
    with bind(per_device):  # the micro-batch's tokens on this device for the batch's
        boundary = boundary_tensors(par, rank)[0] * stage_boundary(train, par) if rank else 0
        state = {"frozen": integer(0), "step_grads": integer(0),
                 **sharded_state(model, train, par, rank, pricing=pricing),
                 "buffers": ddp_buckets(model, train, par) + boundary}  # fmt: skip
        acts = sharded_activations(model, train, par, rank=rank)
        held = pricing.accumulated_grad_bytes(train, par) * params_per_device(model, par, rank)[0]
        live = _grads_live(par, rank, held)
        with unevaluated():  # unevaluated so the peaks' Max terms are not re-simplified
            peaks = pricing.own_peaks(model, train, par, state, acts, live)
            if peaks is None:
                peaks = _live_set_peaks(model, train, par, rank, state, acts, live, held, pricing)
            peaks = {k: e + held for k, e in peaks.items()}
    peaks = {k: e + gathered for k, e in peaks.items()}
    reserved = peaks["peak"] * R_alloc
    return {**state, "activations": acts, **peaks, "reserved": reserved}


def _grads_live(par: ParallelSpec, rank: PipelineRank | None, held):
    """1 when gradients outlive a micro-batch: when another follows (accumulation), always
    for a buffer allocated once and never freed (Megatron's), never for FSDP2's shards
    under pipelining (reduce-scattered from the held gradients after the last one)."""
    if traits_of(par).grads_always_live:
        return integer(1)
    if not is_zero(held):
        return integer(0)
    return more_than_one(m) if rank is None else grads_at_fullest(par, rank)


def _live_set_peaks(model, train, par, rank, state, acts, live, held, pricing) -> dict:
    """The generic peaks (``single.memory.peak_memory``) of this device's state; where the
    framework models them by position (``pricing.gathered``), the head's candidates
    with its gathered weights, and the blocks' added (``pricing.block_peaks``)."""
    kept = traits_of(par).params_persist
    persist = True if kept or not is_zero(held) else kept
    kw = {"residual": residual_bytes(train, par), "split": Y, "params_persist": persist,
          "grads_live": live, "head": rank is None or rank.last,
          "backward_transient": ring_transient(model, train)}  # fmt: skip
    at_head = {**state, "grads": state["grads"] - held}
    gathered = pricing.gathered(model, train, par)
    if gathered is None:
        return peak_memory(model, train, at_head, acts, **kw)
    at_head["params"], kw["backward_params"] = gathered["head"], gathered["head_backward"]
    peaks = peak_memory(model, train, at_head, acts, casts=False, **kw)
    return pricing.block_peaks(
        model, train, par, peaks, state=state, live=live,
        acts_of=lambda ops: sharded_activations(model, train, par, only=ops),
        grad_shard=PRECISIONS[train.precision].grad / shard_degree(par),
        residual=residual_bytes(train, par))  # fmt: skip


def zero3_gathered(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Bytes of the layers ZeRO-3 has gathered beyond this device's shard (reference model
    and DeepSpeed): the layer running and the next, prefetched; one on a one-layer stage.
    FSDP2's gathered layers are its ``params`` (what it gathers is not stored)."""
    if par.zero != 3 or not traits_of(par).zero3_prefetch:
        return integer(0)
    _, n_mm = params_per_device(model, par)
    layers = stage_layers(par)
    in_flight = smin(2, layers)
    one_layer = n_mm / (layers * stages_held(par)) * (1 - 1 / X)
    if finetune.tunes(train):  # a block's frozen matrices as stored, and its adapters
        act = PRECISIONS[train.precision].activation
        block = finetune.frozen_block_bytes(model, train) + act * finetune.adapter_params(
            model, train) / L  # fmt: skip
        return in_flight * block * (1 - 1 / X)
    if ffn.routes(model):  # the top block, its routed experts gathered over their own group
        top = [(ffn.top(model), integer(1))]
        dense = stacked_blocks(model, top)[1] - expert_block(model)[1]
        _, experts = local_experts(model, top)
        one_layer = dense * (1 - 1 / X) + experts * (1 - 1 / expert_shards(X))
    return in_flight * PRECISIONS[train.precision].activation * one_layer
