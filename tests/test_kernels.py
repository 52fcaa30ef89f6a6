"""Kernels per micro-batch (costmodel.single.kernels) equal what the reference model
dispatches, counted op by op on the meta device (validate.probes.dispatch), and the host
seconds they cost enter the step time as the device runs them: added on a CPU, overlapped
on an accelerator."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel import ParallelSpec, TrainSpec, estimate
from costmodel.catalog.hardware import get_hardware
from costmodel.engine.plan import limit_of
from costmodel.kinds import ffn
from costmodel.single.kernels import counted, graphed_kernels, layer_kernels, model_kernels
from costmodel.single.precision import PRECISIONS
from costmodel.specs.checks import SpecError
from validate.distributed.checks import small_spec
from validate.probes.dispatch import step_kernels
from validate.reference.model import TransformerLM, make_batch

BASE = small_spec()
GQA = BASE.replace(n_kv_heads=2)
XXL = BASE.replace(ffn_only=True, ffn="gelu", vocab=0)
NAIVE = {"attention": "naive"}
DROP = {"attention": "naive", "dropout": 0.1}  # CPU's flash kernel has no dropout
VARIANTS = {
    "fp32": (BASE, {"precision": "fp32"}),
    "bf16-mixed": (BASE, {}),
    "fp16-mixed": (BASE, {"precision": "fp16-mixed"}),
    "bf16": (BASE, {"precision": "bf16"}),
    "layernorm-bias-bf16": (BASE.replace(norm="layernorm", bias=True), {"precision": "bf16"}),
    "layernorm": (BASE.replace(norm="layernorm"), {}),
    "gelu": (BASE.replace(ffn="gelu"), {}),
    "bias": (BASE.replace(bias=True), {}),
    "qkv-bias": (BASE.replace(qkv_bias=True), {}),
    "learned": (BASE.replace(pos="learned"), {}),
    "tied": (BASE.replace(tied=True), {}),
    "gqa": (GQA, {}),
    "qk-norm": (GQA.replace(qk_norm=True), {}),
    "qk-norm-layernorm-fp32": (GQA.replace(qk_norm=True, norm="layernorm"), {"precision": "fp32"}),
    "naive": (BASE, NAIVE),
    "naive-gqa": (GQA, NAIVE),
    "dropout": (BASE, DROP),
    "full": (BASE, {"recompute": "full"}),
    "full-fp32": (BASE, {"recompute": "full", "precision": "fp32"}),
    "selective": (BASE, {"recompute": "selective"}),
    "selective-naive": (BASE, {**NAIVE, "recompute": "selective"}),
    "selective-dropout": (BASE, {**DROP, "recompute": "selective"}),
    "selective-naive-gqa-bf16": (GQA, {**NAIVE, "recompute": "selective", "precision": "bf16"}),
    "selective-op": (BASE, {"recompute": "selective-op"}),
    "selective-op-naive": (BASE, {**NAIVE, "recompute": "selective-op"}),
    "selective-op-dropout": (BASE, {**DROP, "recompute": "selective-op"}),
    "full-dropout": (BASE, {**DROP, "recompute": "full"}),
    "window": (BASE.replace(sliding_window=5), {}),  # the additive band mask
    "window-naive": (GQA.replace(sliding_window=5), NAIVE),  # the bool band mask
    "ffn-only": (XXL, {"precision": "fp32"}),
    "ffn-only-bf16": (XXL, {}),
}


def _measured(spec, train) -> tuple[tuple[int, int], tuple[int, int]]:
    """(per block, outside the blocks) kernels, forward and backward, from models of one
    and two blocks."""
    counts = {}
    for layers in (1, 2):
        model = TransformerLM.for_training(spec.replace(n_layers=layers), train, device="meta")
        fwd, bwd = step_kernels(model, make_batch(model, 2, 16, device="meta"))
        counts[layers] = (fwd.n, bwd.n)
    per = tuple(two - one for one, two in zip(counts[1], counts[2], strict=True))
    return per, tuple(one - p for one, p in zip(counts[1], per, strict=True))


@pytest.mark.parametrize("name", VARIANTS)
def test_kernel_counts_equal_the_reference_model(name):
    spec, kw = VARIANTS[name]
    train = TrainSpec(batch=2, seq=16, elementwise="eager", **kw)
    residual = PRECISIONS[train.precision].residual
    per_block, outside = _measured(spec, train)
    assert counted(layer_kernels(spec, train, residual), spec) == per_block
    assert counted(model_kernels(spec, train, residual), spec) == outside


def test_fused_regions_are_fewer_kernels_than_eager():
    for recompute in ("none", "full", "selective", "selective-op"):
        eager = TrainSpec(elementwise="eager", recompute=recompute)
        fused = eager.replace(elementwise="fused")
        fewer, more = (
            counted(layer_kernels(BASE, t, r), BASE) for t, r in ((fused, 2), (eager, 4))
        )
        for a, b in zip(fewer, more, strict=True):
            assert 0 < a < b


CPU = get_hardware("cpu")
H100 = get_hardware("h100-sxm")
TINY = TrainSpec(batch=1, seq=16, precision="fp32", elementwise="eager")


def _host_free(hw):
    return dataclasses.replace(hw, dispatch_s=0.0)


def test_cpu_adds_host_seconds_per_kernel():
    """On a CPU the dispatching thread runs the kernels: the step grows by exactly the
    host seconds of every kernel, micro-batches and blocks included."""
    train = TINY.replace(batch=2, grad_accum=2)
    with_host = estimate(BASE, train, ParallelSpec(), CPU)
    without = estimate(BASE, train, ParallelSpec(), _host_free(CPU))
    layer, outside = (counted(k(BASE, train, 4), BASE) for k in (layer_kernels, model_kernels))
    kernels = 2 * sum(BASE.n_layers * n + k for n, k in zip(layer, outside, strict=True))
    assert with_host["time_s.host"] == pytest.approx(kernels * CPU.dispatch_s)
    assert with_host["time_s.step"] - without["time_s.step"] == pytest.approx(
        kernels * CPU.dispatch_s, rel=1e-9
    )


def test_accelerator_overlaps_host_seconds():
    """A GPU queues kernels asynchronously: host time matters only where it exceeds the
    device's (a tiny model), never for a large one."""
    slow_host = dataclasses.replace(H100, dispatch_s=20e-6)
    tiny = estimate(BASE, TINY, ParallelSpec(), slow_host)
    assert (
        tiny["time_s.step"] > estimate(BASE, TINY, ParallelSpec(), _host_free(H100))["time_s.step"]
    )
    assert tiny["time_s.compute"] == pytest.approx(tiny["time_s.host"])
    big = small_spec().replace(d_model=4096, n_heads=32, d_ff=14336, n_layers=4, vocab=32000)
    train = TrainSpec(batch=8, seq=4096, elementwise="eager")
    assert estimate(big, train, ParallelSpec(), slow_host)["time_s.step"] == pytest.approx(
        estimate(big, train, ParallelSpec(), _host_free(H100))["time_s.step"], rel=1e-12
    )


def test_negative_dispatch_seconds_are_refused():
    with pytest.raises(SpecError, match="dispatch_s"):
        dataclasses.replace(CPU, dispatch_s=-1e-6)


@pytest.mark.parametrize(("spec", "kw"), [
    (GQA, NAIVE),  # the grouped heads' repeats
    (BASE.replace(n_experts=4, experts_per_token=2, n_shared_experts=1, d_ff_expert=32), {}),
])  # fmt: skip
def test_host_seconds_count_the_sizes_of_the_model_asked(spec, kw):
    """The step's host seconds come from one compiled structure per kind of model; the
    counts it holds follow each model's sizes (they were the structure's placeholder's: an
    MoE block counted as 2 experts of top-1, grouped heads as none)."""
    train = TINY.replace(**kw)
    est = estimate(spec, train, ParallelSpec(), CPU)
    block = counted(layer_kernels(spec, train, 4, block=ffn.top(spec).name), spec)
    kernels = spec.n_layers * sum(block) + sum(counted(model_kernels(spec, train, 4), spec))
    assert est["time_s.host"] == pytest.approx(kernels * CPU.dispatch_s, rel=1e-12)


def _moe_step(framework: str, recompute: str = "none", **kw):
    """A 4-layer MoE (16 experts, top 2) on 8 H100s, ep 4, under ``framework``, with fused
    elementwise kernels; ``kw``: hardware fields, or ParallelSpec's ``expert_gemm``,
    ``cuda_graphs``, ``capacity_factor`` and ``capacity_pad``."""
    model = BASE.replace(n_experts=16, experts_per_token=2, d_ff_expert=64)
    train = TrainSpec(batch=16, seq=256, grad_accum=2, recompute=recompute, elementwise="fused")
    fields = ("expert_gemm", "cuda_graphs", "capacity_factor", "capacity_pad")
    layout = {k: kw.pop(k) for k in fields if k in kw}
    par = ParallelSpec(framework=framework, dp=8, ep=4, **layout)
    return model, estimate(model, train, par, dataclasses.replace(H100, **kw))


@pytest.mark.parametrize(("recompute", "passes"), [("none", 3), ("full", 4)])
def test_a_per_expert_gemm_loop_is_host_time_the_device_overlaps(recompute, passes):
    """Megatron-Core's grouped MLP launches fc1 and fc2 per local expert from the host:
    forward 2 launches per expert, backward 4 (their data and weight gradients), full
    recomputation 2 more, each ``expert_call_s`` of host time. The device runs while the
    host launches, so a slow loop sets each phase (the longer of host and device) and a
    fast one costs nothing."""
    model, slow = _moe_step("megatron", recompute, expert_call_s=1e-3, launch_s=0.0)
    launches = 2 * model.n_layers * (16 // 4) * 2 * passes  # micro-batches x blocks x local
    assert slow["time_s.expert_host"] == pytest.approx(launches * 1e-3, rel=1e-12)
    assert slow["time_s.compute"] == pytest.approx(launches * 1e-3, rel=1e-12)
    _, fast = _moe_step("megatron", recompute, expert_call_s=1e-12, launch_s=0.0)
    _, free = _moe_step("megatron", recompute, expert_call_s=0.0, launch_s=0.0)
    assert fast["time_s.step"] == pytest.approx(free["time_s.step"], rel=1e-12)


def test_one_grouped_kernel_launches_no_loop():
    """torch's _grouped_mm (FSDP2 / torchtitan) reads its offsets on the device: no expert
    launches, whatever the profile says; ``expert_gemm`` states a recipe's own (Megatron
    with Transformer Engine's cuBLASLt grouped GEMM; a loop under FSDP2); a dense model has
    none."""
    _, fsdp2 = _moe_step("fsdp2", expert_call_s=1e-3)
    assert fsdp2["time_s.expert_host"] == 0
    _, grouped = _moe_step("megatron", expert_call_s=1e-3, expert_gemm="grouped")
    assert grouped["time_s.expert_host"] == 0
    _, looped = _moe_step("fsdp2", expert_call_s=1e-3, expert_gemm="loop")
    assert looped["time_s.expert_host"] > 0
    dense = estimate(BASE, TINY, ParallelSpec(framework="megatron"), H100)
    assert dense["time_s.expert_host"] == 0


@pytest.mark.parametrize(("recompute", "passes"), [("none", 1), ("full", 2)])
def test_the_device_idles_at_least_one_launch_at_each_moe_sync(recompute, passes):
    """Each dropless routed block's forward reads its token counts on the host before the
    dispatch (under ep); the device then waits for the host to launch what follows. Where
    the device takes longer over it (a near-free host), one kernel launch: micro-batches x
    MoE blocks x forwards (the recomputed one too) x ``launch_s``. A whole-step CUDA graph
    and a dispatch padded to its capacity (static shapes) have none; a capacity without
    padding still reads its counts back."""
    model, est = _moe_step("megatron", recompute, launch_s=1e-9, expert_call_s=0.0)
    assert est["time_s.sync_idle"] == pytest.approx(2 * model.n_layers * passes * 1e-9)
    _, graphed = _moe_step("megatron", recompute, launch_s=7e-6, cuda_graphs="full")
    assert graphed["time_s.sync_idle"] == 0 and graphed["time_s.host"] == 0
    _, padded = _moe_step("megatron", recompute, launch_s=7e-6, capacity_factor=1.0,
                          capacity_pad=True)  # fmt: skip
    assert padded["time_s.sync_idle"] == 0 and padded["time_s.host"] > 0
    _, dropping = _moe_step(
        "megatron", recompute, launch_s=1e-9, expert_call_s=0.0, capacity_factor=1.0
    )  # no padding: the counts are read back
    assert dropping["time_s.sync_idle"] == pytest.approx(est["time_s.sync_idle"])


@pytest.mark.parametrize(("recompute", "passes"), [("none", 1), ("full", 2)])
def test_a_slow_host_after_the_sync_idles_the_device_for_the_difference(recompute, passes):
    """Where the host takes longer than the device over what follows a sync (the expert
    GEMMs a per-expert loop launches: fc1 and fc2 per local expert), the device idles for
    the difference: each more second per launch idles it micro-batches x blocks x local
    experts x 2 x forwards seconds more. The phase takes the longer of its host time and
    its device time plus that idle time, so a host-bound phase is its host time."""
    model, slow = _moe_step("megatron", recompute, launch_s=0.0, expert_call_s=1e-3)
    _, slower = _moe_step("megatron", recompute, launch_s=0.0, expert_call_s=2e-3)
    launches = 2 * model.n_layers * (16 // 4) * 2 * passes
    more = slower["time_s.sync_idle"] - slow["time_s.sync_idle"]
    assert more == pytest.approx(launches * 1e-3, rel=1e-9)
    host_bound = slower["time_s.host"] >= slower["time_s.compute"] - 1e-12
    assert host_bound and slower["time_s.compute"] == pytest.approx(slower["time_s.host"])


def test_partial_cuda_graphs_launch_attention_and_routing_as_one_each():
    """Megatron-Core's Transformer Engine graphs of attention and the MoE router: per block
    and pass, the captured kernels cost the host one launch per graph
    (``costmodel.single.kernels.graphed_kernels``)."""
    model, eager = _moe_step("megatron", launch_s=1e-3, expert_call_s=0.0)
    _, graphed = _moe_step("megatron", launch_s=1e-3, expert_call_s=0.0, cuda_graphs="partial")
    train = TrainSpec(batch=16, seq=256, grad_accum=2, elementwise="fused")
    saved = sum(counted(graphed_kernels(model, train, block="moe"), model))
    assert saved > 0
    assert eager["time_s.host"] - graphed["time_s.host"] == pytest.approx(
        2 * model.n_layers * saved * 1e-3, rel=1e-9
    )


def test_host_bound_micro_batches_take_the_same_time():
    """The shape of AMD's DeepSeek-V2-Lite micro-batch sweep (AMD-AGI/Primus
    examples/moe_package): where the host binds, a micro-batch twice as large takes the
    same time; where the device does, twice the time."""
    model = BASE.replace(n_experts=16, experts_per_token=2, d_ff_expert=64)

    def per_micro_batch(micro: int, dispatch: float) -> float:
        train = TrainSpec(batch=16 * micro, seq=1024, grad_accum=2, elementwise="fused")
        hw = dataclasses.replace(H100, launch_s=dispatch, expert_call_s=dispatch)
        est = estimate(model, train, ParallelSpec(framework="megatron", dp=8, ep=4), hw)
        return est["time_s.compute"] / 2

    assert per_micro_batch(2, 1e-2) == pytest.approx(per_micro_batch(1, 1e-2), rel=1e-9)
    assert per_micro_batch(2, 0.0) == pytest.approx(2 * per_micro_batch(1, 0.0), rel=0.05)


def test_negative_expert_call_seconds_are_refused():
    with pytest.raises(SpecError, match="expert_call_s"):
        dataclasses.replace(H100, expert_call_s=-1e-6)


def test_the_verdict_names_the_host_where_it_binds():
    """Where the device waits for the host's launches for most of the step, the answer's
    "limited by" says so (a newcomer reads that line, not time_s.host_bound)."""
    _, est = _moe_step("megatron", expert_call_s=1e-3)
    assert limit_of(est.values, 80e9).startswith("host kernel launches (")
    _, fsdp2 = _moe_step("fsdp2", expert_call_s=1e-3, launch_s=0.0)
    assert "host" not in limit_of(fsdp2.values, 80e9)
