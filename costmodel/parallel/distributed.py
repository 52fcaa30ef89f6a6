"""Per-device memory under DP, FSDP (ZeRO 1/2/3), TP (+SP), PP and CP, by framework.

Sources: ZeRO stages (Rajbhandari et al. 2020, Sec. 5); tensor and sequence parallel
activations (Korthikanti et al. 2022, Table 2: sbh(10 + 24/t + 5as/ht) without SP, all /t
with SP); what each pipeline rank holds (``costmodel.parallel.pipeline``: 1F1B keeps
pp - r micro-batches on rank r, interleaving more; Narayanan et al. 2021). Communication
is ``costmodel.parallel.communication``. Bytes, per device.
"""

from __future__ import annotations

import sympy as sp

from costmodel.parallel import fsdp2, handwritten
from costmodel.parallel.experts import (
    busiest_experts,
    expert_block,
    expert_replicas,
    expert_shards,
    local_experts,
    sharded_params,
    split_state,
)
from costmodel.parallel.pipeline import (
    TORCH_PIPELINING,
    PipelineRank,
    boundary_tensors,
    chunks_in_flight,
    grads_at_fullest,
    held_layers,
    present,
    rank_layers,
    ranks,
)
from costmodel.single.memory import (
    HEAD_PARTS,
    MOE_PARTS,
    SHARED_PARTS,
    activation_memory,
    kept_weight_copies,
    optimizer_temp,
    peak_memory,
)
from costmodel.single.params import (
    block_params,
    moe_layers,
    param_breakdown,
    stacked_blocks,
)
from costmodel.single.precision import PRECISIONS, optimizer_state_bytes
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols import (
    D,
    H,
    K,
    L,
    L_d,
    N_cp,
    N_dp,
    N_ep,
    N_pp,
    R_alloc,
    T,
    V,
    X,
    Y,
    as_expr,
    b,
    d_h,
    m,
    more_than_one,
    smax,
    v,
)

_TP_SHARDED = ("attention", "attn_out_input", "ffn_hidden", "loss", "matmul_outputs")
_TP_PARTIAL = ("row_outputs",)  # D-wide partial sums before the reduce, on every TP rank
# column-parallel matmul inputs: under sequence parallelism DTensor (torch's TP styles) saves
# the all-gathered input; Megatron saves its sequence shard and gathers again in backward
_SP_GATHERED = ("attn_input", "ffn_input", "lm_head_input")
DTENSOR_FRAMEWORKS = ("reference", "fsdp2")  # tensor parallelism through torch's DTensor


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
    return X * N_cp if par.shards_over_cp else X


def replicas(par: ParallelSpec) -> sp.Expr:
    """Devices whose gradients of the same parameter shard the data-parallel all-reduce
    sums: dp, times cp where the framework does not shard over the cp ranks (they hold
    the same parameters and see different chunks of the sequences: Megatron reduces over
    its dp x cp group, ``get_data_parallel_group(with_context_parallel=True)``)."""
    return N_dp if par.shards_over_cp else N_dp * N_cp


def optimizer_shards(par: ParallelSpec) -> sp.Expr:
    """Devices the optimizer state is split over: the ZeRO group (fsdp, x cp under FSDP2),
    or every data-parallel rank (x cp) under Megatron's distributed optimizer."""
    return replicas(par) * X if par.framework == "megatron" else shard_degree(par)


def residual_bytes(train: TrainSpec, par: ParallelSpec) -> int:
    """Residual stream and norm inputs: fp32 under torch.autocast (the reference model),
    the compute dtype where the framework runs the model in it (FSDP2's param_dtype,
    Megatron without --fp32-residual-connection, DeepSpeed's bf16 engine)."""
    prec = PRECISIONS[train.precision]
    return prec.residual if par.framework == "reference" else prec.activation


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
    n, n_mm = params_per_device(model, par, rank)
    prec = PRECISIONS[train.precision]
    if par.framework == "reference" or (not prec.weight_copy and par.framework != "fsdp2"):
        head = None if model.ffn_only else V * D / Y * int(rank is None or rank.last)
        kept = kept_weight_copies(model, train, matmul=n_mm, head=head)
        if rank is not None and par.pp > 1:  # autocast casts again for each micro-batch,
            kept *= chunks_in_flight(par, rank) / v  # and each keeps its casts to backward
        shards = (X if par.zero == 3 else 1, X if par.zero >= 2 else 1, X)
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
    n, _ = params_per_device(model, par)
    experts, _ = device_experts(model, par)
    grad = PRECISIONS[train.precision].grad
    if par.zero == 1:
        return grad * n * more_than_one(replicas(par) * X)
    # a routed expert's gradient is reduced only over the ranks holding that expert
    reduced = (n - experts) * more_than_one(replicas(par))
    if model.moe:
        reduced += experts * more_than_one(expert_replicas(shard_degree(par), replicas(par)))
    return grad * reduced * (1 - more_than_one(X))


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
        held, layers = held_layers(par, rank), rank_layers(par, rank)
        micro_batches = chunks_in_flight(par, rank) / v * int(rank.first)
    else:  # the busiest stage's layers, L without pp
        held, layers, micro_batches = stage_layers(par), stage_layers(par), 1
    shares = _layer_shares(model, held, held * moe_blocks(model, par, rank) / layers)
    head = 1 if rank is None or rank.last else 0
    total = sp.Integer(0)
    dtensor = par.framework in DTENSOR_FRAMEWORKS
    for op, expr in parts.items():
        if op in SHARED_PARTS:  # the reference model makes its tables in every forward
            again = op in ("rope", "attn_mask") and rank is not None
            again = again and par.framework == "reference"  # (torchtitan keeps freqs_cis)
            total += expr * (chunks_in_flight(par, rank) if again else 1)
            continue
        sequence = par.sequence_parallel and not (dtensor and op in _SP_GATHERED)
        sharded = op not in _TP_PARTIAL and (sequence or op in _TP_SHARDED)
        scale = head if op in HEAD_PARTS else shares.get(op, shares["all"])
        if op == "moe_experts":  # the pairs the busiest ep rank's experts run
            scale *= busiest_experts()
        total += expr / (Y if sharded else 1) * scale
    if rank is not None and only is None:
        total += boundary_tensors(par, rank)[1] * stage_boundary(train, par)
        if rank.last and not model.ffn_only and par.framework in TORCH_PIPELINING:
            # the last stage's output is the logits, kept to its backward like any other
            total += PRECISIONS[train.precision].activation * b * T * V / Y
    if only is not None and "inputs" not in only:
        return total
    return total + micro_batches * dtensor_embedding_buffers(model, train, par)


def _layer_shares(model: ModelSpec, held: sp.Expr, held_moe: sp.Expr) -> dict[str, sp.Expr]:
    """Multipliers of ``activation_memory``'s parts (each summed over the blocks that have
    it) for ``held`` layer-micro-batches of which ``held_moe`` are MoE blocks': ``all`` for
    what every block keeps, the MoE parts and the dense FFN's over their own blocks."""
    shares = {"all": held / L}
    if model.moe:  # max(.., 1): a part over no blocks is 0 whatever multiplies it
        shares.update(dict.fromkeys(MOE_PARTS, held_moe / moe_layers(model)))
        shares["ffn_hidden"] = (held - held_moe) / sp.Max(L_d, 1)
    return shares


def ring_transient(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Bytes ring attention holds in a layer's backward beside the activations, in terms of
    b and T (0 without cp): the fp32 query-gradient accumulator, the fp32 K/V gradient
    accumulators of the chunk in hand and of the one arriving, the K/V chunk arriving
    and one block's gradients in the compute dtype (torch's context_parallel backward
    allocates the same, plus its send buffers; measured on the hand-written ring,
    ``validate.distributed.context``)."""
    if model.ffn_only:
        return sp.Integer(0)
    c = PRECISIONS[train.precision].activation
    per_token = (4 * H + 16 * K + 2 * c * K + c * (H + 2 * K)) * d_h / Y
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
    parallel``, layouts tp and tp-sp); Megatron's VocabParallelEmbedding reduces in place (none)."""
    if model.ffn_only or par.framework not in DTENSOR_FRAMEWORKS:
        return sp.Integer(0)
    copies = 3 / Y if par.sequence_parallel else 2
    b_dev, t_dev = device_batch()
    return more_than_one(Y) * copies * residual_bytes(train, par) * b_dev * t_dev * D


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
    state = {**sharded_state(model, train, par, rank),
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
    if model.moe:  # an MoE block, its routed experts gathered over their own shard group
        _, mm = stacked_blocks(model, sp.Integer(1), sp.Integer(1))
        _, experts = local_experts(model, sp.Integer(1))
        mm -= expert_block(model)[1] - experts
        one_layer = (mm - experts) * (1 - 1 / X) + experts * (1 - 1 / expert_shards(X))
    return in_flight * PRECISIONS[train.precision].activation * one_layer
