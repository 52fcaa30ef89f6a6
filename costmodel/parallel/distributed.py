"""Per-device state and memory under DP, FSDP (ZeRO 1/2/3), TP (+SP), PP, CP and EP, by
framework, and its peaks.

Sources: ZeRO stages (Rajbhandari et al. 2020, Sec. 5); what each pipeline rank holds
(``costmodel.parallel.pipeline``: 1F1B keeps pp - r micro-batches on rank r, interleaving
more; Narayanan et al. 2021). A device's shares of the layout are
``costmodel.parallel.shares``, its activations ``costmodel.parallel.activations``, its
communication ``costmodel.parallel.communication``. Bytes, per device.
"""

from __future__ import annotations

import sympy as sp

from costmodel.parallel import fsdp2, handwritten
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
    sharded_params,
    split_state,
)
from costmodel.parallel.pipeline import (
    PipelineRank,
    boundary_tensors,
    chunks_in_flight,
    grads_at_fullest,
    present,
    rank_layers,
    ranks,
)
from costmodel.parallel.shares import (
    device_batch,
    device_experts,
    moe_blocks,
    optimizer_shards,
    replicas,
    residual_bytes,
    shard_degree,
    stage_layers,
)
from costmodel.single import finetune
from costmodel.single.memory import (
    HEAD_PARTS,
    kept_weight_copies,
    optimizer_temp,
    peak_memory,
    state_memory,
)
from costmodel.single.params import (
    block_params,
    param_breakdown,
    stacked_blocks,
)
from costmodel.single.precision import PRECISIONS, optimizer_state_bytes
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols import (
    D,
    L,
    N_ep,
    N_pp,
    R_alloc,
    T,
    V,
    X,
    Y,
    as_expr,
    b,
    m,
    more_than_one,
    smax,
    v,
)


def params_per_device(
    model: ModelSpec, par: ParallelSpec, rank: PipelineRank | None = None
) -> tuple[sp.Expr, sp.Expr]:
    """(all, matmul-weight) parameters one device holds before ZeRO: blocks of one stage
    split over tp (norms replicated), vocabulary matrices split over tp (vocab-parallel).
    ``rank``: that pipeline rank's exactly (its layers, the embedding on the first, the
    final norm and head on the last); without it, with pp > 1, the busiest stage's layers
    with the larger of the embedding and the head (an upper bound for every rank)."""
    parts = param_breakdown(model)
    block = block_params(model, norms=False)
    norm_total = parts["norms"]
    vocab_in = parts["embedding"] + parts["pos_embedding"]
    head = parts["lm_head"]
    head_mm = 0 if model.ffn_only else V * D
    layers = rank_layers(par, rank) if rank is not None else stage_layers(par)
    blocks, blocks_mm = stacked_blocks(model, layers, moe_blocks(model, par, rank))
    # the routed experts the other ep ranks hold (MoE models run without tp)
    others = [e * (N_ep - 1) for e in device_experts(model, par, rank)]
    blocks, blocks_mm = blocks - others[0], blocks_mm - others[1]
    if rank is not None:
        block_norms = block_params(model, norms=True) - block
        final_norm = norm_total - L * block_norms
        ends = (vocab_in if rank.first else 0) + (head if rank.last else 0)
        total = blocks / Y + layers * block_norms + ends / Y + (final_norm if rank.last else 0)
        return total, blocks_mm / Y + (head_mm / Y if rank.last else 0)
    vocab = smax(vocab_in, head) if par.pp > 1 else vocab_in + head
    total = blocks / Y + norm_total / (N_pp if par.pp > 1 else 1) + vocab / Y
    return total, blocks_mm / Y + head_mm / Y


def sharded_state(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None = None
) -> dict[str, sp.Expr]:
    """params (working weights), master, grads, optimizer per device, by framework (on
    pipeline rank ``rank``, see :func:`params_per_device`).

    reference: torch.autocast's state (fp32 parameters, kept low-precision weight casts)
    under ZeRO over X (Rajbhandari et al. 2020, Sec. 5). fsdp2: fp32 parameters, gradients
    (reduce-scattered in fp32, torchtitan's default reduce dtype) and optimizer state
    sharded over X (x cp); ``params`` are the most gathered weights in flight at once
    (:func:`costmodel.parallel.fsdp2.in_flight`; in fp32 too: FSDP2 gathers into buffers of
    its own beside the shards). megatron:
    bf16 parameters, fp32 main gradients, fp32 master and optimizer state sharded over the
    data-parallel ranks (distributed optimizer; Megatron-LM docs, "Distributed Optimizer":
    6 + 12/d bytes per parameter). deepspeed: bf16 parameters and gradients, fp32 master and
    optimizer state, each sharded by its ZeRO stage over X.
    """
    if par.framework == "handwritten":
        return handwritten.state(model, train)
    if finetune.tunes(train):  # data parallelism and ZeRO alone (``finetune_rule``)
        return state_memory(model, train, shards=zero_shards(par))
    n, n_mm = params_per_device(model, par, rank)
    prec = PRECISIONS[train.precision]
    if par.framework == "reference" or (not prec.weight_copy and par.framework != "fsdp2"):
        head = None if model.ffn_only else V * D / Y * int(rank is None or rank.last)
        kept = kept_weight_copies(model, train, matmul=n_mm, head=head)
        if rank is not None and par.pp > 1:  # autocast casts again for each micro-batch,
            kept *= chunks_in_flight(par, rank) / v  # and each keeps its casts to backward
        shards = zero_shards(par)
        state = split_state(model, train, n, kept, shards, device_experts(model, par, rank))
        if rank is None or rank.first:
            state["grads"] += replicated_embedding_grad(model, train) / shards[1]
        return state
    low = prec.activation

    routed, _ = device_experts(model, par, rank)

    def per_shard(shards: sp.Expr) -> sp.Expr:  # the routed experts over their own group
        return sharded_params(model, n, shards, routed)

    def opt(shards: sp.Expr) -> sp.Expr:
        return optimizer_state_bytes(train.optimizer, train.precision, per_shard(shards))

    if par.framework == "fsdp2":
        s = shard_degree(par)
        if par.pp == 1:  # the most gathered at once, at the blocks or at the head
            unsharded = smax(*fsdp2.in_flight(model, train, par).values())
            return {"params": unsharded, "master": prec.param * per_shard(s),
                    "grads": prec.grad * per_shard(s), "optimizer": opt(s)}  # fmt: skip
        # Under pipelining torchtitan keeps the stage unsharded from its first micro-batch
        # to its last (reshard_after_forward=False) and accumulates unsharded gradients in
        # the reduce dtype until the last backward reduce-scatters them.
        return {"params": low * n, "master": prec.param * per_shard(s),
                "grads": accumulated_grads(train, par) * n + prec.grad * per_shard(s),
                "optimizer": opt(s)}  # fmt: skip
    if par.framework == "megatron":
        dp = optimizer_shards(par)
        return {"params": low * n, "master": prec.param * per_shard(dp), "grads": prec.grad * n,
                "optimizer": opt(dp)}  # fmt: skip
    p_sh, g_sh = (X if par.zero == 3 else 1), (X if par.zero >= 2 else 1)
    return {"params": low * per_shard(p_sh), "master": prec.param * per_shard(X),
            "grads": low * per_shard(g_sh), "optimizer": opt(X)}  # fmt: skip


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
        return sp.Integer(0)
    return PRECISIONS[train.precision].grad * V * D * (1 - 1 / Y)


def accumulated_grads(train: TrainSpec, par: ParallelSpec) -> int:
    """Bytes per parameter of unsharded gradients held through the whole step (FSDP2 under
    pipelining, in the reduce dtype); 0 elsewhere."""
    if par.framework != "fsdp2" or par.pp == 1 or not PRECISIONS[train.precision].weight_copy:
        return 0
    return 4 if par.grad_reduce_fp32 else PRECISIONS[train.precision].activation


def ddp_buckets(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Bytes of torch DDP's gradient buckets on a device: one flat copy of every gradient in
    the gradient dtype, allocated when the model is wrapped and kept (``Reducer``; the
    default ``gradient_as_bucket_view=False`` copies each gradient in before its bucket's
    all-reduce and back after). The reference framework runs DDP over dp replicas when it
    does not shard (fsdp 1), and under ZeRO-1 (a sharded optimizer over DDP's replicas);
    FSDP (ZeRO-2/3), FSDP2, Megatron and DeepSpeed reduce without DDP's buckets. Under
    expert parallelism a routed expert's gradient is bucketed only where other ranks hold
    the same expert (torch DDP leaves out the parameters it is told to ignore)."""
    if par.framework != "reference":
        return sp.Integer(0)
    n = trained_per_device(model, train, par)
    experts, _ = device_experts(model, par)
    grad = PRECISIONS[train.precision].grad
    if par.zero == 1:
        return grad * n * more_than_one(replicas(par) * X)
    # a routed expert's gradient is reduced only over the ranks holding that expert
    reduced = (n - experts) * more_than_one(replicas(par))
    if model.moe:
        reduced += experts * more_than_one(expert_replicas(shard_degree(par), replicas(par)))
    return grad * reduced * (1 - more_than_one(X))


def sharded_memory(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, sp.Expr]:
    """Per-device memory by component and its peak: with pp > 1 each the maximum over the
    pipeline ranks that bound every rank (:func:`costmodel.parallel.pipeline.ranks`)."""
    if par.pp == 1:
        return rank_memory(model, train, par)
    per_rank = [(present(r), rank_memory(model, train, par, r)) for r in ranks(par)]
    return {k: smax(*(w * d[k] for w, d in per_rank)) for k in per_rank[0][1]}


def rank_memory(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None = None
) -> dict[str, sp.Expr]:
    """One device's memory by component and its peak (same estimate as one device, plus
    ZeRO-3's two gathered layers in flight (one on a stage of one layer), gradients held
    through the step, and as ``buffers`` DDP's gradient buckets and a pipelining runtime's
    receive buffers); ``rank``: the pipeline rank it is (none without pp)."""
    boundary = boundary_tensors(par, rank)[0] * stage_boundary(train, par) if rank else 0
    state = {"frozen": sp.Integer(0), **sharded_state(model, train, par, rank),
             "buffers": ddp_buckets(model, train, par) + boundary}  # fmt: skip
    acts = sharded_activations(model, train, par, rank=rank)
    per_device = dict(zip(("b", "T"), device_batch(), strict=True))
    subs = {b: per_device["b"], T: per_device["T"]}
    # a plain symbol swap; unevaluated so the peaks' Max terms are not re-simplified
    held = accumulated_grads(train, par) * params_per_device(model, par, rank)[0]
    persist = par.framework in ("megatron", "deepspeed") or bool(held) or None
    if par.framework == "fsdp2" and not held:  # gathered layers, freed after backward
        persist = False
    # Megatron's gradient buffer is allocated once and zeroed, never freed; elsewhere
    # gradients outlive a micro-batch when another follows (accumulation), except FSDP2's
    # shards under pipelining: reduce-scattered from the held gradients after the last one
    live = more_than_one(m) if rank is None else grads_at_fullest(par, rank)
    live = sp.Integer(1) if par.framework == "megatron" else sp.Integer(0) if held else live
    kw = {"residual": residual_bytes(train, par), "split": Y, "params_persist": persist,
          "grads_live": live, "head": rank is None or rank.last,
          "backward_transient": ring_transient(model, train)}  # fmt: skip
    positional = par.framework == "fsdp2" and par.pp == 1
    at_head = {**state, "grads": state["grads"] - held}
    if positional:  # the generic candidates are the head's; the blocks' are added below
        gathered = fsdp2.in_flight(model, train, par)
        at_head["params"], kw["backward_params"] = gathered["head"], gathered["head_backward"]
    with sp.evaluate(False):
        if par.framework == "handwritten":
            temp = optimizer_temp(train, state["optimizer"])
            head = sharded_activations(model, train, par, only=HEAD_PARTS)
            peaks = handwritten.peaks(model, train, state, acts, head, live, temp)
        else:
            peaks = peak_memory(model, train, at_head, acts, **kw)
        if positional:
            peaks = fsdp2.with_block_peaks(
                model, train, par, peaks, state=state, live=live,
                acts_of=lambda ops: sharded_activations(model, train, par, only=ops),
                grad_shard=PRECISIONS[train.precision].grad / shard_degree(par),
                residual=residual_bytes(train, par))  # fmt: skip
        peaks = {k: (e + held).xreplace(subs) for k, e in peaks.items()}
        state = {k: as_expr(e).xreplace(subs) for k, e in state.items()}
    gathered = zero3_gathered(model, train, par)
    peaks = {k: e + gathered for k, e in peaks.items()}
    reserved = peaks["peak"] * R_alloc
    return {**state, "activations": acts.xreplace(subs), **peaks, "reserved": reserved}


def zero3_gathered(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Bytes of the layers ZeRO-3 has gathered beyond this device's shard (reference model
    and DeepSpeed): the layer running and the next, prefetched; one on a one-layer stage.
    FSDP2's gathered layers are its ``params`` (what it gathers is not stored)."""
    if par.zero != 3 or par.framework not in ("reference", "deepspeed"):
        return sp.Integer(0)
    _, n_mm = params_per_device(model, par)
    layers = stage_layers(par)
    in_flight = sp.Min(2, layers, evaluate=False)
    one_layer = n_mm / layers * (1 - 1 / X)
    if finetune.tunes(train):  # a block's frozen matrices as stored, and its adapters
        act = PRECISIONS[train.precision].activation
        block = finetune.frozen_block_bytes(model, train) + act * finetune.adapter_params(
            model, train) / L  # fmt: skip
        return in_flight * block * (1 - 1 / X)
    if model.moe:  # an MoE block, its routed experts gathered over their own shard group
        dense = stacked_blocks(model, sp.Integer(1), sp.Integer(1))[1] - expert_block(model)[1]
        _, experts = local_experts(model, sp.Integer(1))
        one_layer = dense * (1 - 1 / X) + experts * (1 - 1 / expert_shards(X))
    return in_flight * PRECISIONS[train.precision].activation * one_layer
