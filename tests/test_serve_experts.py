"""Expert parallelism in ``serve`` (issue 40, item 2): routed experts whole over ep devices
spanning ep / tp replicas (attention data parallelism), the weights per device exact, the
experts a decode step reads from the whole group's tokens, dispatch and combine priced
over NVLink and the network, and bad layouts refused naming ep."""

from __future__ import annotations

import dataclasses
import math

import pytest

from costmodel import get_hardware, get_model
from costmodel.kinds.routing import routing_hits
from costmodel.serving.estimate import decode_step, serve
from costmodel.serving.experts import LOW_LATENCY_NIC, alltoall_s, low_latency_rates
from costmodel.specs.checks import SpecError
from costmodel.specs.serving import ServeSpec

H100 = get_hardware("h100-sxm")
DSV3 = get_model("deepseek-v3")
BASE = dict(input=2000, output=1000, batch=64, precision="fp8", tp=8, dp=2)
ROUTED = 58 * 256 * 3 * 7168 * 2048  # MoE blocks x experts x (gate, up, down) x D x width


def test_ep_over_one_replicas_tp_ranks_is_the_tp_layout():
    tp = serve(DSV3, ServeSpec(**BASE), H100).values
    ep = serve(DSV3, ServeSpec(**BASE, ep=8), H100).values
    for key in ("memory_bytes_per_device.weights", "time_s.tpot", "time_s.ttft",
                "bytes_per_device.decode_step", "flops_per_device.decode_step"):  # fmt: skip
        assert ep[key] == pytest.approx(tp[key], rel=1e-12), key


def test_ep_over_two_replicas_holds_half_the_experts_a_device():
    tp = serve(DSV3, ServeSpec(**BASE), H100).values
    ep = serve(DSV3, ServeSpec(**BASE, ep=16), H100).values
    shed = ROUTED / 8 - ROUTED / 16  # fp8: one byte an element
    assert tp["memory_bytes_per_device.weights"] - ep["memory_bytes_per_device.weights"] == (
        pytest.approx(shed, rel=1e-12)
    )
    assert not tp["fits"] and ep["fits"]  # 671B in fp8 fits 16 H100 only with ep
    # the group's 2 x 64 tokens reach more of a device's 16 experts than one replica's would
    step = decode_step(DSV3, ServeSpec(**BASE, ep=16), H100)
    assert step["expert_bytes"] == pytest.approx(ROUTED / 16 * (1 - (1 - 8 / 256) ** 128))


def test_dispatch_and_combine_cross_the_network_beyond_a_node():
    """Each device sends its 64 / 8 tokens of 7,168 activations each way per MoE layer,
    dispatched in fp8 (the weights' dtype) and combined in bf16, as DeepEP does: one copy
    per other node and rank its 8 experts hit (from 4 of DeepSeek-V3's 8 groups; of 16
    ranks, 8 in its node), at DeepEP's rates (0.75 of the H100's NVLink, 0.86 of a NIC)."""
    spec = ServeSpec(**BASE, ep=16)
    assert spec.precision == "fp8"
    nodes, ranks = routing_hits("random", 256, 8, 16, 8, 8, 4)
    free = routing_hits("random", 256, 8, 16, 8)  # random routing's, without the groups
    assert nodes < free[0] and ranks < free[1]

    def one_way(nbytes: int) -> float:
        per_token = 64 / 8 * 7168 * nbytes
        local = per_token * ranks / (H100.link_bw * 0.75)
        remote = per_token * nodes / (H100.network_bw * 0.86)
        return H100.network_latency_s + max(local, remote)

    assert alltoall_s(DSV3, spec, H100, 64, 2) == pytest.approx(58 * (one_way(1) + one_way(2)))
    bf16 = ServeSpec(**{**BASE, "precision": "bf16"}, ep=16)
    assert alltoall_s(DSV3, bf16, H100, 64, 2) == pytest.approx(58 * 2 * one_way(2))
    assert alltoall_s(DSV3, ServeSpec(**BASE, ep=8), H100, 64, 2) == 0  # ep = tp: all-reduce
    tp = decode_step(DSV3, ServeSpec(**BASE), H100)["phase"]["comm"]
    ep = decode_step(DSV3, spec, H100)["phase"]["comm"]
    # the MoE layers' second all-reduce gives way to the exchange (58 of 61 blocks route)
    reduce = tp / (2 * 61)
    decode = alltoall_s(DSV3, spec, H100, 64, 2, decode=True)  # the low-latency kernels
    assert ep == pytest.approx(tp - 58 * reduce + decode)


def test_decode_runs_deepeps_low_latency_kernels_at_their_measured_rates():
    """A decode step's dispatch and combine on DeepEP's low-latency kernels: each device's
    64 / 8 tokens' 8 copies of 7,168 values, fp8 out and bf16 back, at the rates DeepEP's
    README measured at EP 16 on H800s with one 400 Gb/s NIC each (63 and 74 GB/s; the H100's
    NIC is the same), where prefill keeps the normal kernels."""
    spec = ServeSpec(**BASE, ep=16)
    assert H100.network_bw == LOW_LATENCY_NIC
    assert low_latency_rates(16, H100) == pytest.approx((63e9, 74e9))
    copies = 64 / 8 * 8 * 7168
    want = 58 * copies * (1 / 63e9 + 2 / 74e9)
    assert alltoall_s(DSV3, spec, H100, 64, 2, decode=True) == pytest.approx(want)
    assert alltoall_s(DSV3, spec, H100, 64, 2) != pytest.approx(want)  # prefill: normal ones
    # between measured sizes, linear in log2(ep); beyond them, the ends
    mid = low_latency_rates(24, H100)[0]
    assert mid == pytest.approx(63e9 + (48e9 - 63e9) * (math.log2(24) - 4))
    assert low_latency_rates(512, H100) == low_latency_rates(256, H100) == (39e9, 40e9)
    # a device with twice the NIC rate runs them twice as fast
    fast = dataclasses.replace(H100, network_bw=2 * H100.network_bw)
    assert low_latency_rates(16, fast) == pytest.approx((126e9, 148e9))


@pytest.mark.parametrize(
    ("model", "flags"),
    [
        ("llama3-8b", ["--ep", "2"]),
        ("deepseek-v3", ["--tp", "8", "--dp", "2", "--ep", "12"]),
        ("deepseek-v3", ["--tp", "8", "--dp", "2", "--ep", "4"]),
        ("deepseek-v3", ["--tp", "8", "--dp", "2", "--ep", "32"]),
    ],
)
def test_bad_expert_layouts_are_one_line_naming_ep(model, flags, refused):
    base = ["serve", "--model", model, "--context", "2048", "--precision", "fp8"]
    assert "ep" in refused([*base, *flags])


def test_redundant_experts_add_copies_a_device_holds_and_let_ep_divide_them():
    """DeepSeek-V3's 256 experts do not split over 72 devices; with 32 copies (288 slots,
    the paper's decode deployment) each device holds 4 whole experts: 4 / (256 / 72) of the
    weights of an even split, and a step's tokens spread over the copies."""
    base = {**BASE, "tp": 1, "dp": 72}
    with pytest.raises(SpecError) as err:
        serve(DSV3, ServeSpec(**base, ep=72), H100)
    assert err.value.field == "ep" and "--redundant-experts" in str(err.value)
    est = serve(DSV3, ServeSpec(**base, ep=72, redundant_experts=32), H100)
    even = serve(DSV3, ServeSpec(**{**base, "dp": 64}, ep=64), H100)  # 4 experts each too
    held, split = (e["memory_bytes_per_device.weights"] for e in (est, even))
    assert held == pytest.approx(split) and est["fits"]
    with pytest.raises(SpecError) as err:
        ServeSpec(**BASE, redundant_experts=8)
    assert err.value.field == "redundant_experts"


def test_off_nvidia_gpus_the_exchange_is_an_all_to_all():
    """DeepEP runs on NVIDIA GPUs (NVLink and RDMA), as training refuses it elsewhere: a
    TPU's expert exchange sends one copy per routed pair, k(ep - 1)/ep of a token's, at the
    profile's link rate, however the experts spread."""
    from costmodel.kinds.dispatch import dispatch_rates
    from costmodel.serving.experts import _one_way, dispatcher

    tpu = get_hardware("tpu-v5p")
    assert dispatcher(tpu) == "all-to-all" and dispatcher(H100) == "deepep"
    mixtral = get_model("mixtral-8x7b")
    spec = ServeSpec(input=1000, output=100, batch=8, tp=2, dp=4, ep=8)
    node = min(8, tpu.devices_per_node)
    link, network, _ = dispatch_rates("all-to-all", tpu)
    per_token = 8 / 2 * 4096 * 2
    local, remote = 2 * (node - 1) / 8, 2 * (8 - node) / 8
    want = tpu.network_latency_s + max(per_token * local / link, per_token * remote / network)
    assert _one_way(mixtral, spec, tpu, 8, 2) == pytest.approx(want, rel=1e-12)


def test_routed_experts_run_as_one_grouped_kernel_at_its_own_rate():
    """Mixtral's routed experts (top 2 of 8, three 4,096 x 14,336 matmuls each, 32 layers)
    are priced as their own kernel at serve_flops x efficiency.serve_grouped; the dense
    matmuls keep their rate, and a dense model has no such kernel."""
    mixtral, spec = get_model("mixtral-8x7b"), ServeSpec(input=2000, output=200, batch=64,
                                                         precision="fp8", tp=2)  # fmt: skip
    routed = 64 * 2000 * 32 * 2 * 3 * 2 * 4096 * 14336 / 2  # tokens x L x k x 3 x 2 x D x F / tp
    out = serve(mixtral, spec, H100).values
    grouped = H100.serve_flops("fp8") * H100.eff("serve_grouped")
    assert H100.eff("serve_grouped") < 1
    assert out["time_s.prefill.experts_compute"] == pytest.approx(routed / grouped, rel=1e-12)
    slower = dataclasses.replace(H100, efficiency={**H100.efficiency, "serve_grouped": 0.35})
    half = serve(mixtral, spec, slower).values
    assert half["time_s.prefill.experts_compute"] == pytest.approx(
        out["time_s.prefill.experts_compute"] * grouped / slower.serve_grouped_flops("fp8")
    )
    assert half["time_s.prefill.matmuls_compute"] == out["time_s.prefill.matmuls_compute"]
    assert half["time_s.ttft"] > out["time_s.ttft"]
    dense = serve(get_model("llama3-8b"), spec, H100).values
    assert dense["time_s.prefill.experts_compute"] == 0
    assert dense["time_s.decode_step.experts_memory"] == 0


def test_what_limits_a_moe_decode_step_can_be_its_routed_experts():
    """The "limited by" line weighs the routed experts' kernel as a part of its own: a
    Mixtral decode step at batch 32 spends most of its time reading the experts."""
    from costmodel.answers.serve_words import limited_by

    spec = ServeSpec(input=2000, output=500, batch=32, precision="fp8", tp=2)
    v = serve(get_model("mixtral-8x7b"), spec, H100).values
    step = v["time_s.decode_step.experts_memory"] / v["time_s.decode_step.total"]
    assert step > 0.5
    assert limited_by(v).startswith(
        f"decode: the routed experts (one grouped kernel), memory-bound ({step:.0%} of a step)"
    )
