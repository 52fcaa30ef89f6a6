"""Communication per device per step under DP, FSDP (ZeRO), TP (+SP), PP, CP and EP: bytes
each device sends and their alpha-beta seconds, per phase.

Sources: ring collectives move 2(N-1)/N of the buffer for an all-reduce and (N-1)/N for an
all-gather or reduce-scatter, with (N-1) or 2(N-1) latency steps (Thakur et al. 2005; the
alpha-beta model); Megatron's f and g (Shoeybi et al. 2019, Sec. 3); ring attention as
torch's context_parallel runs it (:func:`cp_group`; Liu et al. 2023).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.kinds import attention
from costmodel.kinds.dispatch import sends_per_token
from costmodel.parallel.collectives import allreduce_steps, bus_factor, ring_steps
from costmodel.parallel.experts import (
    busiest_experts,
    expert_replicas,
    expert_shards,
    sharded_params,
)
from costmodel.parallel.shares import (
    device_batch,
    device_blocks,
    device_experts,
    replicas,
    residual_bytes,
    routed_blocks,
    shard_degree,
    stage_layers,
)
from costmodel.parallel.state import trained_per_device
from costmodel.single import finetune
from costmodel.single.memory import checkpointed_share
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import Pricing, traits_of
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import (
    W_X,
    W_Y,
    D,
    N_cp,
    N_ep,
    N_etp,
    N_pp,
    S_bucket,
    W_cp,
    W_dp,
    W_ep,
    W_epn,
    W_pp,
    Y,
    a_cp,
    a_dp,
    a_ep,
    a_pp,
    a_X,
    a_Y,
    as_expr,
    k_r,
    m,
    more_than_one,
    sceil,
    smax,
    smin,
    v,
)
from costmodel.symbols.ops import integer, ratio

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def communication(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, *, pricing: Pricing
) -> dict[str, dict]:
    """Per group: bytes sent per device per step and alpha-beta seconds, split by phase.

    Returns ``{group: {"bytes": e, "forward": t, "backward": t, "optimizer": t}}``.
    Gradients and gathered parameters travel in the compute dtype (bf16 under mixed
    precision, as FSDP's MixedPrecisionPolicy and Megatron's bf16 reduce).
    """
    prec = PRECISIONS[train.precision]
    c = prec.activation
    n = trained_per_device(model, train, par)
    b_dev, t_dev = device_batch()
    shards = shard_degree(par)
    groups: dict[str, dict] = {}

    grad_bytes = 4 if par.grad_reduce_fp32 else c
    dp = replicas(par)  # the cp ranks too where they are not FSDP shards
    experts, _ = device_experts(model, par)
    dense, e_shards = n - experts, expert_shards(shards)

    def reduced(op: str = "all_reduce") -> sp.Expr:
        """Gradient elements a device all-reduces (or reduce-scatters, or all-gathers) over
        the replicas: the dense parameters' shard, a routed expert's over the replicas
        holding that expert."""
        return (bus_factor(op, dp) * dense / shards
                + bus_factor(op, expert_replicas(shards, dp)) * experts / e_shards)  # fmt: skip

    def sharded(op: str) -> sp.Expr:
        """Elements a device moves gathering or scattering its parameters over the shard
        group (a routed expert's over its own, :func:`expert_shards`)."""
        return bus_factor(op, shards) * dense + bus_factor(op, e_shards) * experts

    per_device = sharded_params(model, n, shards, experts)
    if traits_of(par).distributed_optimizer:  # scatter, step, gather
        scatter, gather = grad_bytes * reduced("reduce_scatter"), c * reduced("all_gather")
        lat = ring_steps("all_gather", dp) * a_dp * sceil(per_device / megatron_bucket(dp))
        groups["dp"] = _phases(scatter + gather, gather / W_dp + lat, scatter / W_dp + lat, 0)
    else:  # DDP's buckets of bucket_mb
        groups["dp"] = _bucketed(par, grad_bytes * reduced(), grad_bytes * per_device, dp)

    gather, scatter = c * sharded("all_gather"), grad_bytes * sharded("reduce_scatter")
    if finetune.tunes(train) and par.zero == 3:  # the frozen weights, as stored
        gather += bus_factor("all_gather", shards) * finetune.frozen_bytes(model, train)
    groups["fsdp"] = fsdp_group(par, gather, scatter, ring_steps("all_gather", shards) * a_X)

    groups["fsdp"] = pricing.fsdp_group(model, train) or groups["fsdp"]
    groups["tp"] = tp_group(model, train, par)

    act = c * b_dev * t_dev * D
    p2p = act / (Y if par.sequence_parallel else 1)
    sends = m * v * (N_pp - 1) / N_pp
    one = sends * (p2p / W_pp + a_pp)
    groups["pp"] = _phases(2 * sends * p2p, one, one, 0)

    groups["cp"] = cp_group(model, train, par)
    groups["ep"] = ep_group(model, train, par)
    return groups


def fsdp_group(par: ParallelSpec, gather: sp.Expr, scatter: sp.Expr, alpha: sp.Expr) -> dict:
    """The ZeRO shard group's traffic per device per step, from the bytes of one pass of
    parameter all-gathers (``gather``) and of gradient reduce-scatters (``scatter``), and
    one collective's latency (``alpha``; one collective per layer and pass).

    ZeRO-3 gathers in every micro-batch's forward, again in its backward where the layer
    was resharded after forward, and reduce-scatters in every backward (FSDP1, FSDP2 and
    DeepSpeed under gradient accumulation: each micro-batch frees what it gathered); under
    pipelining the stage stays unsharded from its first micro-batch to its last and
    reduce-scatters once (torchtitan). ZeRO-1/2 reduce-scatter in backward and gather the
    updated parameters after the optimizer step, once per step.
    """
    lat = stage_layers(par) * alpha
    if par.zero != 3:
        return _phases(scatter + gather, 0, scatter / W_X + lat, gather / W_X + alpha)
    passes = m if par.pp == 1 else 1
    again = 1 if par.reshard_after_forward and par.pp == 1 else 0
    fwd, bwd = passes * gather, passes * (again * gather + scatter)
    return _phases(fwd + bwd, fwd / W_X + passes * lat, bwd / W_X + passes * (1 + again) * lat, 0)


def _bucketed(
    par: ParallelSpec, dp_bytes: sp.Expr, grads: sp.Expr, dp: sp.Expr
) -> dict[str, sp.Expr]:
    """Data-parallel all-reduces of ``grads`` bytes of gradients in buckets of
    ``bucket_mb`` (``dp_bytes`` on the wire), one latency term per bucket, beside the
    backward. Under torch DDP's buckets (the framework's ``ddp_buckets``) the last bucket
    is launched once the backward has produced its last gradient, so nothing hides it: it
    runs after the backward, a bucket as large as every gradient reducing them all there
    (Li et al. 2020, "PyTorch Distributed", Sec. 3.2.3, Fig. 6)."""
    per_bucket = allreduce_steps(dp) * a_dp
    lat = per_bucket * sceil(grads / S_bucket)
    if not traits_of(par).ddp_buckets:
        return _phases(dp_bytes, 0, dp_bytes / W_dp + lat, 0)
    last = smin(1, S_bucket / smax(grads, 1))
    tail = last * dp_bytes / W_dp + per_bucket
    rest = (1 - last) * dp_bytes / W_dp + smax(0, lat - per_bucket)  # no bucket: none
    return _phases(dp_bytes, 0, rest, tail)


def megatron_bucket(dp: sp.Expr) -> sp.Expr:
    """Parameters per gradient bucket in Megatron-Core's DDP: max(4e7, 1e6 x the dp x cp
    ranks), "larger DP sizes need larger buckets to ensure collectives do not become
    latency-bound" (``DistributedDataParallelConfig.bucket_size``)."""
    return smax(40_000_000, 1_000_000 * dp)


def ep_group(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, sp.Expr]:
    """Expert parallelism's dispatches: bytes sent per device per step and their
    alpha-beta seconds on the busiest rank (GShard, Lepikhin et al. 2020, Sec. 2.2;
    torchtitan's and Megatron's token dispatchers). Per MoE block and micro-batch, forward
    dispatches each token to the ranks holding its k experts and combines the outputs
    back; backward sends their gradients the other way: four dispatches of the device's
    b·T tokens of D values in the compute dtype, each the copies the dispatcher sends over
    the network and over NVLink at once, the slower setting its time
    (:mod:`costmodel.kinds.dispatch`), ``ep_imbalance`` times that to and from the
    busiest rank. Full recomputation dispatches and combines again. The MoE blocks are
    the device's (its stage's under pipelining). Under tensor parallelism each tp rank
    dispatches its own 1/tp sequence shard, and the tokens an expert receives are
    all-gathered over the etp ranks that split it and its outputs reduce-scattered back
    (Megatron-Core's ``MoEAlltoAllTokenDispatcher``: the all-to-all over ep, then the
    gather over etp), on the etp ranks' link, the innermost (tp's). None for a dense
    model."""
    if not any(kind.routes for kind, _ in device_blocks(model, par)):  # none routes tokens
        return _phases(0, 0, 0, 0)
    calls = m * routed_blocks(model, par)
    c = PRECISIONS[train.precision].activation
    b_dev, t_dev = device_batch()
    tokens = c * b_dev * t_dev / Y * D * busiest_experts()
    network, nvlink = sends_per_token()
    gathered = tokens * k_r * bus_factor("all_gather", N_etp) * N_etp  # the etp ranks gather
    again = 2 * checkpointed_share(train) if train.recompute == "full" else 0
    each = smax(tokens * network / W_epn, tokens * nvlink / W_ep)
    each += ring_steps("all_to_all", N_ep) * a_ep
    each += gathered / W_Y + ring_steps("all_gather", N_etp) * a_Y
    sent = calls * (4 + again) * (tokens * (network + nvlink) + gathered)
    return _phases(sent, calls * 2 * each, calls * (2 + again) * each, 0)


def cp_group(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, sp.Expr]:
    """Ring attention's bytes sent per device per step and their alpha-beta seconds, as
    torch's context_parallel runs it (``_templated_ring_attention`` and its backward,
    torch 2.13; Liu et al. 2023): per layer and micro-batch the K/V chunk goes N - 1
    hops in forward and again in backward, where fp32 accumulators of its gradient
    (``convert_to_f32``) go N hops, the last bringing them home. Measured exactly by
    ``validate.distributed.context`` (the same ring by hand on gloo ranks)."""
    if model.ffn_only:
        return _phases(0, 0, 0, 0)
    c = PRECISIONS[train.precision].activation
    b_dev, t_dev = device_batch()
    _, key, value = attention.projections(model).ring_widths(model, train.attention)
    kv = c * b_dev * t_dev * (key + value) / Y
    kv_grad = kv * 4 / c
    layers = stage_layers(par)
    hops = m * layers * ring_steps("all_gather", N_cp)
    grad_hops = m * layers * N_cp * more_than_one(N_cp)
    forward = hops * (kv / W_cp + a_cp)
    backward = forward + grad_hops * (kv_grad / W_cp + a_cp)
    return _phases(2 * hops * kv + grad_hops * kv_grad, forward, backward, 0)


def tp_group(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, sp.Expr]:
    """Tensor-parallel bytes sent per device per step and their alpha-beta seconds.

    Per layer and micro-batch (Megatron's f and g, Shoeybi et al. 2019, Sec. 3): one
    all-reduce of the b·T·D block output in forward per sub-block, one of its input's
    gradient in backward; recomputation re-runs a block's forward ones. Vocabulary-parallel
    embedding and head (Megatron; torchtitan's plan): the embedding's partial rows are
    summed in forward (in the residual dtype), the head input's gradient in backward (in
    the compute dtype), and the vocab-parallel cross-entropy all-reduces three fp32 scalars
    per token (the max, the target logit and the sum of exponentials). Under sequence
    parallelism each all-reduce is a reduce-scatter plus an all-gather: the same bytes,
    the vocabulary's split half in forward, half in backward. With pp > 1 the device with
    the larger share: the embedding's (first stage) or the head and loss's (last). Where
    the framework overlaps the column-parallel linears' backward collectives with their
    GEMMs (``Framework.tp_backward_overlap``), backward also gathers each input shard
    again, and ``backward_overlapped`` says the seconds of it hidden beside the GEMMs.
    Under sequence parallelism the all-gathers (half of a block's bytes) move a matmul's
    input, which an fp8 recipe quantises first (``Precision.matmul_input`` bytes a value):
    Transformer Engine's ``LayerNormLinear``/``LayerNormMLP`` pass the input quantizer to
    ``gather_along_first_dim`` under fp8, and torchao's ``Float8ColwiseParallel`` and
    ``PrepareFloat8ModuleInput`` (torchtitan's float8 TP) cast before gathering; the
    reduce-scatters of the outputs and of the input gradients stay in the compute dtype.
    """
    b_dev, t_dev = device_batch()
    per_token = b_dev * t_dev
    prec = PRECISIONS[train.precision]
    act = prec.activation * per_token
    # under sequence parallelism half of a block's bytes are all-gathers of a matmul's
    # input, which an fp8 recipe gathers quantised (matmul_input bytes a value)
    gathered = ratio(prec.activation + prec.matmul_input, 2) * per_token
    block = gathered if par.sequence_parallel else act
    per_layer = 1 if model.ffn_only or model.parallel_block else 2
    layers = stage_layers(par)
    # all-reduce-equivalent widths per layer (forward, backward): the FFN's D each way,
    # attention's D, or MLA's gathered latents in (r_q + r_kv + d_r) and D out
    attn_fwd, attn_bwd = _attention_widths(model, par)
    width_fwd, width_bwd = D + attn_fwd, D + attn_bwd
    # recomputation re-runs a block's collectives; op-level selective AC all but the last,
    # the FFN's, which follows the saved last matmul (torch.utils.checkpoint's early stop)
    last = 0 if train.dropout else 1  # a branch dropout's mask follows the last one
    share = checkpointed_share(train)  # of the checkpointed blocks (recompute_every)
    again = {"full": share * width_fwd, "selective-op": width_fwd - last * D}.get(
        train.recompute, 0
    )
    count = {"full": share * per_layer, "selective-op": per_layer - last}.get(train.recompute, 0)
    ar, steps = bus_factor("all_reduce", Y), ring_steps("all_reduce", Y)
    fwd_b = m * layers * ar * block * width_fwd
    bwd_b = m * layers * ar * block * (width_bwd + again)
    fwd_n, bwd_n = m * layers * per_layer, m * layers * (per_layer + count)
    overlapped = integer(0)
    if par.sequence_parallel and traits_of(par).tp_backward_overlap and not par.async_tp:
        # the input shards gathered again (half an all-reduce) beside dgrad, and the input
        # gradients' reduce-scatters beside wgrad: a backward all-reduce's worth hidden
        # (async TP prices every TP collective by its chunked overlap: exposure.py)
        hidden_b, hidden_n = m * layers * ar * block * width_bwd, m * layers * per_layer
        bwd_b, bwd_n = bwd_b + hidden_b / 2, bwd_n + hidden_n / 2
        overlapped = hidden_b / W_Y + hidden_n * steps * a_Y
    if not model.ffn_only:
        embed = ar * residual_bytes(train, par) * per_token * D
        head, loss = ar * act * D, 3 * ar * 4 * per_token
        split = ratio(1, 2) if par.sequence_parallel else 0
        vocab_in = (embed * (1 - split), embed * split)  # (forward, backward) bytes
        vocab_out = (head * split + loss, head * (1 - split))
        if par.pp > 1:  # on different stages: the device with the larger share
            vocab_in = (smax(vocab_in[0], vocab_out[0]), smax(vocab_in[1], vocab_out[1]))
            vocab_out = (0, 0)
        fwd_b += m * (vocab_in[0] + vocab_out[0])
        bwd_b += m * (vocab_in[1] + vocab_out[1])
        fwd_n += m * (4 if par.pp == 1 else 3)  # all-reduce equivalents (latency)
        bwd_n += m
    phases = _phases(
        fwd_b + bwd_b, fwd_b / W_Y + fwd_n * steps * a_Y, bwd_b / W_Y + bwd_n * steps * a_Y, 0
    )
    return {**phases, "backward_overlapped": as_expr(overlapped)}


def _attention_widths(model: ModelSpec, par: ParallelSpec) -> tuple[sp.Expr, sp.Expr]:
    """Attention's tensor-parallel collectives per layer as all-reduce-equivalent widths
    per token, (forward, backward): 0 for an FFN-only stack and a parallel block (its
    branches read one gathered input and their summed output is reduced once, with the
    FFN's); else, with g the width gathered before the head-split matmuls (D; MLA's
    latents, ``Projections.gathered_width``), under sequence parallelism a gather of g and
    a reduce-scatter of the D-wide output each way ((g + D) / 2 all-reduces); without it
    the output's all-reduce in forward and the gathered input's gradient in backward."""
    if model.ffn_only or model.parallel_block:  # a parallel block's is the FFN's one
        return integer(0), integer(0)
    g = attention.projections(model).gathered_width(model)
    if par.sequence_parallel:
        return (g + D) / 2, (g + D) / 2
    return D, g


def _phases(total_bytes, forward, backward, optimizer) -> dict[str, sp.Expr]:
    return {
        "bytes": as_expr(total_bytes),
        "forward": as_expr(forward),
        "backward": as_expr(backward),
        "optimizer": as_expr(optimizer),
    }
