"""Roofline step time, MFU and HFU on one device of a parallel layout.

Each matmul on a device is (n x k)(k x n2) with n tokens per micro-batch: time =
max(2·n·k·n2 / C_eff, bytes / W_hbm), bytes = the operands and the result in the compute
dtype (Williams et al. 2009, roofline; Scaling Book ch. 1: arithmetic intensity against C /
W_hbm). Its backward is two such matmuls; the fused attention backward 2.5x the core, which
runs its kind's pairs: the causal half of the T x T work, or a sliding window's band (the
naive core runs all of it, as separate kernels whose times add: two batched matmuls and the
memory-bound mask and softmax). Elementwise work (norms, activations, rotary, residuals,
softmax, loss) is memory-bound: reading and writing what a forward without recomputation
keeps, twice that in backward (an estimate), what recomputation keeps or not. Step time
adds, per phase, compute and communication under the overlap rule (``max`` overlaps fully,
as the current Scaling Book; ``sum`` not at all, as its earlier edition), the 1F1B bubble
(p-1)/(v·m) of the compute (Narayanan et al. 2021, Sec. 2.2; DualPipe's, DeepSeek-V3
report Table 2), and an optimizer step bound by
memory traffic. Each phase's kernels (and a per-expert loop's GEMM launches) also cost host
time, which a phase overlaps with its device time, and a device idles at each MoE layer's
host sync (``costmodel.parallel.host``).
MFU counts the model FLOPs (PaLM, App. B; unmasked pairs only); HFU counts what runs,
recomputation included.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from costmodel.kinds import attention, ffn
from costmodel.parallel.activations import sharded_activations
from costmodel.parallel.communication import communication
from costmodel.parallel.experts import dropped_fraction
from costmodel.parallel.exposure import exposed_groups, exposed_share
from costmodel.parallel.gemms import all_gemms, gemm_cost, gemm_seconds
from costmodel.parallel.host import expert_launches, host_seconds, sync_idle, with_host
from costmodel.parallel.pipeline import pipeline_bubble, stages_held
from costmodel.parallel.shares import (
    device_batch,
    device_blocks,
    optimizer_shards,
    residual_bytes,
    stage_layers,
)
from costmodel.parallel.state import params_per_device, trained_per_device
from costmodel.single import finetune
from costmodel.single.elementwise import eager_bytes
from costmodel.single.flops import backward_factor, flop_conventions
from costmodel.single.memory import checkpointed_share, checkpoints_blocks
from costmodel.single.params import op_level_recomputed
from costmodel.single.precision import PRECISIONS, optimizer_traffic
from costmodel.specs.frameworks import Pricing, traits_of
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.algebra import bind
from costmodel.symbols.core import (
    B,
    C,
    C_attn,
    C_attn_b,
    C_eff,
    D,
    F,
    H,
    K,
    N_cp,
    N_dp,
    N_pp,
    T,
    V,
    W_hbm,
    X,
    Y,
    b,
    eta_ov,
    g_full,
    m,
    s_sync,
    smax,
    smin,
    t_ex,
)
from costmodel.symbols.ops import add, integer, scaled

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def block_shares(model: ModelSpec, par: ParallelSpec) -> list[tuple[ffn.FFNKind, sp.Expr]]:
    """(FFN kind, the fraction of the busiest stage's blocks of that kind): 1 for a dense
    model; an MoE model's dense leading blocks and MoE ones (under pipelining the busiest
    stage's are all MoE blocks)."""
    device = device_blocks(model, par)
    if len(device) == 1:
        return [(device[0][0], integer(1))]
    return [(kind, n / stage_layers(par)) for kind, n in device]


def _layer_share(model: ModelSpec, par: ParallelSpec, op: str) -> sp.Expr:
    """The fraction of the stage's blocks that run ``op``: each FFN kind's ops run in its
    blocks, every other op in all of them."""
    shares = [share for kind, share in block_shares(model, par) if op in kind.ops]
    return shares[0] if shares else integer(1)


def roofline(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec
) -> dict[str, dict[str, sp.Expr]]:
    """Per op, one micro-batch on one device: forward flops, bytes, intensity, seconds, and
    backward seconds (an MoE model's FFN ops averaged over the stage's blocks: dense
    leading blocks and MoE ones). Matmuls as :mod:`costmodel.parallel.gemms` costs them."""
    a = PRECISIONS[train.precision].activation
    b_dev, t_dev = device_batch()
    n = b_dev * t_dev
    ops: dict[str, dict[str, sp.Expr]] = {}
    grouped = ffn.grouped_ops(model)
    for op, shapes in all_gemms(model, train, par.sequence_parallel).items():
        terms: list[list[sp.Expr]] = [[], [], [], []]  # flops, bytes, time_s, backward_s
        frozen = backward_factor(op, train) == 1  # a frozen weight: dX alone
        for rows, k, n2, count in shapes:
            tokens = scaled(rows, n)
            cost = gemm_cost(tokens, k, n2, a)
            cost += gemm_seconds(tokens, k, n2, a, frozen, op in grouped, moved=cost[1])
            for out, value in zip(terms, cost, strict=True):
                out.append(scaled(count, value))
        share = _layer_share(model, par, op)
        ops[op] = {key: scaled(share, add(*values)) for key, values in
                   zip(("flops", "bytes", "time_s", "backward_s"), terms, strict=True)}  # fmt: skip
    if not model.ffn_only:
        ops["attn_core"] = _attention_core(model, train, b_dev, t_dev)
    for entry in ops.values():
        # an op that moves nothing (no shared experts, no dense blocks) has intensity 0
        entry["intensity"] = entry["flops"] / smax(entry["bytes"], 1)
    return ops


def _attention_core(model: ModelSpec, train: TrainSpec, b_dev, t_dev) -> dict[str, sp.Expr]:
    """The attention core of one micro-batch, a mean over the layers' kinds
    (``costmodel.kinds.attention``): a fused kernel computes its kind's pairs at tile
    granularity (causal: half of T x T, FlashAttention-2 skipping the masked tiles, Sec.
    3.1.1; a sliding window: its band) at the kernel's forward and backward rates (its
    backward 5/2 x the forward's FLOPs, :func:`backward_factor`); the naive core computes
    every pair, writing and reading the scores, masked scores and probabilities as separate
    kernels whose times add, its backward twice its forward."""
    a = PRECISIONS[train.precision].activation
    projections = attention.projections(model)  # FLOPs per pair, bytes of its operands
    per_pair, nbytes = projections.core_traffic(model, train.attention, b_dev, t_dev, a)
    if train.attention == "naive":
        flops = attention.per_layer(model, lambda kind: per_pair * kind.naive_pairs())
        nbytes += _score_passes(train) * a * b_dev * (H / Y) * T * T
        if train.dropout:  # the probabilities' dropout: read, write, bool mask
            nbytes += (2 * a + 1) * b_dev * (H / Y) * T * T
        seconds = flops / C_eff + nbytes / W_hbm
        return {"flops": flops, "bytes": nbytes, "time_s": seconds, "backward_s": 2 * seconds}

    def fused(rate: sp.Symbol) -> sp.Expr:
        return attention.per_layer(
            model, lambda kind: smax(per_pair * kind.fused_pairs() / rate, nbytes / W_hbm)
        )

    return {
        "flops": attention.per_layer(model, lambda kind: per_pair * kind.fused_pairs()),
        "bytes": nbytes,
        "time_s": fused(C_attn),
        "backward_s": backward_factor("attn_core", train) * fused(C_attn_b),
    }


def _score_passes(train: TrainSpec) -> int:
    """Passes over the T x T scores of a naive core's forward beyond its matmuls' own: the
    first matmul writes them and the second reads the probabilities (2); scale, mask and
    softmax between them read and write once where they are one kernel (fused elementwise:
    Megatron-LM's ``FusedScaleMaskSoftmax``, on by default since 2020, or torch.compile),
    twice as eager PyTorch runs them (the masked scores, then the probabilities)."""
    return 4 if train.elementwise == "fused" else 6


def _recomputed(model: ModelSpec, train: TrainSpec, per_layer: dict[str, sp.Expr]) -> sp.Expr:
    """Per layer, the part of a per-op quantity (seconds or FLOPs) re-run in backward: the
    whole block (full), the core (selective), the matmuls and naive core op-level selective
    AC does not save (``recompute_flops_by_op``)."""
    if train.recompute == "full":  # of the checkpointed blocks (recompute_every)
        return checkpointed_share(train) * sum(per_layer.values(), integer(0))
    if train.recompute == "selective-op":
        redo = op_level_recomputed(model, skip_last=not train.dropout)
        if train.attention == "naive" and "attn_core" in per_layer:
            redo["attn_core"] = integer(1)
        return sum((share * per_layer[op] for op, share in redo.items()), integer(0))
    if train.recompute == "selective" and "attn_core" in per_layer:
        return per_layer["attn_core"]
    return integer(0)


def _ops_per_phase(
    model: ModelSpec,
    train: TrainSpec,
    par: ParallelSpec,
    forward: dict[str, sp.Expr],
    backward: dict[str, sp.Expr],
) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) of one micro-batch's matmuls and attention core on this stage, from
    per-op, per-layer quantities (seconds or FLOPs; ``lm_head`` once per model) of each
    pass; backward adds what recomputation re-runs of the forward."""
    layers = stage_layers(par)

    def stage(per_op: dict[str, sp.Expr]) -> sp.Expr:
        blocks = sum((e for k, e in per_op.items() if k != "lm_head"), integer(0))
        return layers * blocks + per_op.get("lm_head", integer(0))

    per_layer = {k: e for k, e in forward.items() if k != "lm_head"}
    return stage(forward), stage(backward) + layers * _recomputed(model, train, per_layer)


def _elementwise_time(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> tuple:
    """(forward, backward) seconds of one micro-batch's elementwise work on this stage.

    ``fused``: what a forward without recomputation keeps (:func:`_fused_written`), written
    once and read once, and twice that in backward (an estimate), whatever the policy
    keeps: the forward runs every elementwise op, and a recomputed one fuses into the
    backward kernels that read its inputs anyway (as AOTAutograd's min-cut partitioner
    recomputes fusible pointwise ops by default), so recomputation adds its matmuls and
    cores (:func:`_recomputed`) and no elementwise traffic. Checked on Megatron-LM's
    full-recompute runs of Narayanan et al. 2021 (1.4 % median, ``python -m
    validate.published``) and torchtitan's compile speed-up (``tests/test_cluster.py``).
    ``eager``: the reference model's
    op-by-op bytes (``costmodel.single.elementwise``), the forward's again in backward where
    blocks are checkpointed; tensor parallelism splits the heads and the FFN width, and sequence
    parallelism also the tokens of the norms and residual adds.
    """
    b_dev, t_dev = device_batch()
    if train.elementwise == "fused":
        with bind({b: b_dev, T: t_dev}):
            written = _fused_written(model, replace(train, recompute="none"), par)
        fwd = 2 * written / W_hbm
        return fwd, 2 * fwd
    if par.sequence_parallel:
        fwd, bwd = (e / Y for e in _eager_bytes(model, train, par))
    else:  # a tp rank's heads and FFN width
        with bind({F: F / Y, H: H / Y, K: K / Y}):
            fwd, bwd = _eager_bytes(model, train, par)
    tokens = stage_layers(par) * b_dev * t_dev / W_hbm
    return tokens * fwd, tokens * bwd


def _eager_bytes(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> tuple:
    """(forward, backward) bytes per token of one block's eager elementwise ops, averaged
    over the FFN kinds of the stage's blocks; backward repeats the forward's where blocks
    are checkpointed."""
    prec = PRECISIONS[train.precision]
    args = (model, residual_bytes(train, par), prec.activation, train.dropout > 0)
    fwd = bwd = integer(0)
    for kind, share in block_shares(model, par):  # the blocks' average over the FFN kinds
        kind_fwd, kind_bwd = eager_bytes(*args, block=kind.name)
        fwd, bwd = fwd + share * kind_fwd, bwd + share * kind_bwd
    if checkpoints_blocks(train):
        bwd += checkpointed_share(train) * fwd
    return fwd, bwd


def _fused_written(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """What one device keeps of a micro-batch for the fused elementwise kernels: its
    activations, less the naive attention core's scores and probabilities, which that
    core's own kernels read and write (:func:`_attention_core`) and recomputation re-runs
    with it (:func:`_recomputed`)."""
    kept = sharded_activations(model, train, par)
    if train.attention == "naive":
        kept -= sharded_activations(model, train, par, only=("attention",))
    return kept


def _casts_and_loss(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, pricing: Pricing
) -> tuple:
    """(forward, backward) bytes of the weight casts, fp8 scaling and the loss, per
    micro-batch.

    Mixed precision under torch.autocast (the reference framework) casts each matmul weight
    to the compute dtype in forward (read the stored dtype, write the copy) and the copy's
    gradient back in backward (full recomputation casts again); FSDP2, Megatron and
    DeepSpeed hold or gather the low-precision weights themselves; the hand-written FSDP
    prepares each weight gradient for its fp32 reduce-scatter
    (``Framework.backward_traffic``). fp8 (tensorwise float8
    training, torchao / Transformer Engine) scales every matmul operand: an amax read and a
    cast (read, write one byte) of the input and the weight in forward and of the output
    gradient in backward (5 bytes per bf16 element), plus fp8 transposes of the input and
    weight for the backward matmuls (read and write one byte). The loss casts the logits to
    fp32, log-softmaxes them and in backward writes the NLL and log-softmax gradients and
    casts back: a + 12 and a + 20 bytes per logit (a: compute bytes). All memory-bound.
    """
    prec = PRECISIONS[train.precision]
    weights = params_per_device(model, par)[1] / stages_held(par)  # one stage's, as it runs
    fwd, bwd = finetune.dequantize_traffic(model, train)
    if finetune.tunes(train):  # the adapters are what autocast casts
        weights = finetune.adapter_params(model, train)
        if checkpoints_blocks(train):
            bwd += fwd
    if prec.weight_copy and traits_of(par).autocast:
        fwd += (prec.param + prec.weight_copy) * weights
        bwd += (prec.weight_copy + prec.grad) * weights
        if checkpoints_blocks(train):  # the checkpointed blocks' casts are made again
            bwd += checkpointed_share(train) * (prec.param + prec.weight_copy) * weights
    bwd += pricing.backward_traffic(model, train)
    b_dev, t_dev = device_batch()
    if prec.matmul_input == 1:
        n = b_dev * t_dev
        shapes = [(_layer_share(model, par, op) * c * rows, k, n2)
                  for op, gemms in all_gemms(model, None, par.sequence_parallel).items()
                  if op != "lm_head"
                  for rows, k, n2, c in gemms]  # fmt: skip
        inputs = stage_layers(par) * sum((w * n * k for w, k, _ in shapes), integer(0))
        outputs = stage_layers(par) * sum((w * n * n2 for w, _, n2 in shapes), integer(0))
        mats = weights - (0 if model.ffn_only else V * D / Y)
        fwd += 5 * (inputs + mats)
        bwd += 5 * outputs + 2 * (inputs + mats)
    if not model.ffn_only:
        logits = b_dev * t_dev * V / Y
        fwd += (prec.activation + 12) * logits
        bwd += (prec.activation + 20) * logits
    return (fwd, bwd)


def _phase_seconds(
    comm: dict, name: str, per_mb: sp.Expr, par: ParallelSpec
) -> tuple[sp.Expr, sp.Expr]:
    """Seconds of one phase (forward or backward) of the m micro-batches, and the part of
    them that :func:`contention` adds.

    Under ``max`` the overlapped groups run on a second stream beside the compute, and the
    data-parallel gradient reduce last: DDP (``no_sync``) and Megatron-Core
    (``overlap_grad_reduce``) reduce only in the last micro-batch's backward, and Megatron's
    distributed optimizer gathers its parameters in the first one's forward
    (``overlap_param_gather``), so that collective hides behind one micro-batch, not m
    (Li et al. 2020, "PyTorch Distributed", Sec. 3.2.4; Megatron-Core's
    ``DistributedDataParallel``). Under ``sum`` everything adds. Exposed groups add, but
    for the share :func:`exposed_share` lets async TP or combined 1F1B hide and what their
    framework runs beside the GEMMs (:func:`overlapped`). What overlaps
    runs slower than alone where the device's ``overlap`` is below 1 (:func:`contention`).
    """
    exposed = exposed_groups(par)
    shown = sum(((comm[k][name] - overlapped(comm[k], name)) * exposed_share(k, par)
                 for k in exposed), integer(0))  # fmt: skip
    hidden = sum((g[name] for k, g in comm.items() if k != "dp"), integer(0)) - shown
    compute, dp = m * per_mb, comm["dp"][name]
    if par.overlap == "sum":
        return compute + hidden + dp + shown, integer(0)
    lost = contention(compute, hidden + dp)
    return smax(compute, smax(hidden, compute - per_mb) + dp) + lost + shown, lost


def overlapped(group: dict[str, sp.Expr], phase: str) -> sp.Expr:
    """Seconds of a group's phase its framework hides beside the GEMMs (TP's backward
    under Megatron's sequence parallelism, ``communication.tp_group``); 0 otherwise."""
    return group.get(f"{phase}_overlapped", integer(0))


def contention(compute: sp.Expr, overlapped: sp.Expr) -> sp.Expr:
    """Seconds an overlap loses to contention: (1 - eta_ov) of the shorter of the compute
    and the communication beside it (``Hardware.overlap``; 0 where it is 1)."""
    return (1 - eta_ov) * smin(compute, overlapped)


def _after_sync_device(ops: dict, comm: dict, par: ParallelSpec) -> sp.Expr:
    """Device seconds, per micro-batch forward on this stage, of what follows the MoE
    layers' host syncs: the routed and shared experts' GEMMs and the expert-parallel
    dispatch and combine (``costmodel.parallel.host.sync_idle``)."""
    experts = sum((ops[k]["time_s"] for k in ("experts", "shared_experts") if k in ops),
                  integer(0))  # fmt: skip
    return stage_layers(par) * experts + comm["ep"]["forward"] / m


def _weight_grads(ops: dict, par: ParallelSpec) -> sp.Expr:
    """Seconds of one micro-batch's weight gradients on this stage (DualPipe's W): each
    matmul's dW has its forward's FLOPs and shape class, so its forward's seconds."""
    gemms = {k: e["time_s"] for k, e in ops.items() if k not in ("attn_core", "lm_head")}
    head = ops["lm_head"]["time_s"] if "lm_head" in ops else integer(0)
    return stage_layers(par) * sum(gemms.values(), integer(0)) + head


def step_time(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, *, pricing: Pricing
) -> dict[str, sp.Expr]:
    """time_s.{forward, backward, bubble, optimizer, step} and throughput metrics;
    ``pricing``: the layout's framework (``costmodel.frameworks.framework_of``)."""
    ops = roofline(model, train, par)
    elementwise, elementwise_bwd = _elementwise_time(model, train, par)
    extra_fwd, extra_bwd = _casts_and_loss(model, train, par, pricing)
    fwd_ops, bwd_ops = _ops_per_phase(
        model, train, par, *({k: e[q] for k, e in ops.items()} for q in ("time_s", "backward_s"))
    )
    comm = communication(model, train, par, pricing=pricing)
    host_fwd, host_bwd = host_seconds(model, train, par)
    idle_fwd, idle_bwd = sync_idle(model, train, par, _after_sync_device(ops, comm, par))
    dev_fwd = fwd_ops + elementwise + extra_fwd / W_hbm
    dev_bwd = bwd_ops + elementwise_bwd + extra_bwd / W_hbm
    fwd_mb = with_host(dev_fwd + idle_fwd, host_fwd)
    bwd_mb = with_host(dev_bwd + idle_bwd, host_bwd)
    # HFU: what this device's kernels execute (causal flash skips masked tiles, recomputation
    # re-runs), so that HFU <= 1 whenever no kernel beats the peak
    flops = {k: e["flops"] for k, e in ops.items()}
    backward_flops = {k: backward_factor(k, train) * e for k, e in flops.items()}
    executed = add(*_ops_per_phase(model, train, par, flops, backward_flops))
    (fwd, fwd_lost), (bwd, bwd_lost) = (
        _phase_seconds(comm, "forward", fwd_mb, par),
        _phase_seconds(comm, "backward", bwd_mb, par),
    )
    phase = {"forward": fwd, "backward": bwd}
    bubble = pipeline_bubble(par, fwd_mb, bwd_mb, _weight_grads(ops, par))
    # the optimizer updates the shard its device holds
    n_dev_params = trained_per_device(model, train, par) / optimizer_shards(par)
    traffic = optimizer_traffic(train.optimizer, train.optimizer_impl, train.precision)
    traffic = traffic * n_dev_params
    update = traffic / W_hbm
    optimizer = update + sum((g["optimizer"] for g in comm.values()), integer(0))
    step = phase["forward"] + phase["backward"] + bubble + optimizer
    devices = N_dp * X * Y * N_pp * N_cp
    useful = flop_conventions(model, train)["useful"]
    return {
        "time_s.forward": phase["forward"],
        "time_s.backward": phase["backward"],
        "time_s.bubble": bubble,
        "time_s.optimizer": optimizer,
        "time_s.step": step,
        "time_s.compute": m * (fwd_mb + bwd_mb),
        "time_s.compute_forward": m * fwd_mb,
        "time_s.compute_backward": m * bwd_mb,
        "time_s.microbatch_forward": fwd_mb,
        "time_s.microbatch_backward": bwd_mb,
        "time_s.optimizer_update": update,
        "time_s.host": m * (host_fwd + host_bwd),
        "time_s.expert_host": m * (1 - g_full) * t_ex * add(*expert_launches(model, train, par)),
        "time_s.sync_idle": m * (idle_fwd + idle_bwd),
        "time_s.host_bound": m  # what with_host adds to the device's time
        * add(
            *(
                smax(h - d - idle, 0) + idle + s_sync * smin(d + idle, h)
                for d, h, idle in ((dev_fwd, host_fwd, idle_fwd), (dev_bwd, host_bwd, idle_bwd))
            )
        ),
        "time_s.contention_forward": fwd_lost,
        "time_s.contention_backward": bwd_lost,
        **({"moe.dropped_fraction": dropped_fraction()} if ffn.routes(model) else {}),
        "time_s.comm": sum(
            (g["forward"] + g["backward"] + g["optimizer"] for g in comm.values()), integer(0)
        ),
        "tokens_per_s": B * T / step,
        "mfu": useful / (step * C * devices),
        "hfu": m * executed / (step * C),
        "tflops_per_device": useful / (step * devices) / 10**12,
        **{
            f"roofline.{k}.{q}": e[q]
            for k, e in ops.items()
            for q in ("intensity", "time_s", "backward_s")
        },
        **{f"comm_bytes.{k}": g["bytes"] for k, g in comm.items()},
        **{f"comm_exposed_share.{k}": exposed_share(k, par) for k in exposed_groups(par)},
        "comm_overlapped_s.tp": overlapped(comm["tp"], "backward"),
        **{
            f"comm_time_s.{k}": g["forward"] + g["backward"] + g["optimizer"]
            for k, g in comm.items()
        },
        **{
            f"comm_phase_s.{k}.{ph}": g[ph]
            for k, g in comm.items()
            for ph in ("forward", "backward", "optimizer")
        },
    }
