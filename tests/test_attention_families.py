"""Fused-attention kernel families (issue 12, item 2): each kernel's forward and backward
rate on a device, saturating with the key length per call, from published per-length
benchmarks; the step time uses the chosen kernel's rates; bad names are one clear error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from costmodel import ParallelSpec, TrainSpec, estimate, get_hardware, get_model
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware

H100 = get_hardware("h100-sxm")
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
# Shah et al. 2024 (FlashAttention-3), Fig. 4-5, H100 80GB SXM5, head dim 128, TFLOP/s:
# forward causal, then backward.
FA3_PAPER = {
    "fa3": ((292, 423, 521, 579, 602, 616), (316, 424, 501, 542, 559, 561)),
}
MEASURED = Path(__file__).parents[1] / "validate/measured/h200-attention-2026-11-26"
ROWS = [
    json.loads(line) for line in (MEASURED / "attention_kernels.jsonl").read_text().splitlines()
]
BACKENDS = {"fa2": "flash", "cudnn": "cudnn"}  # costmodel's kernel: torch's SDPA backend


@pytest.mark.parametrize("kernel", sorted(FA3_PAPER))
def test_h100_tables_follow_the_papers_per_length_rates(kernel):
    """The catalog's two efficiencies and half length reproduce every published point of
    FlashAttention-3 within 10 % (the least-squares fit is 1.8-3.7 % rms in log)."""
    for phase, series in zip(("forward", "backward"), FA3_PAPER[kernel], strict=True):
        for seq, tflops in zip(LENGTHS, series, strict=True):
            got = H100.attention_peak("bf16", kernel, phase, seq) / 1e12
            assert got == pytest.approx(tflops, rel=0.10), (kernel, phase, seq)


@pytest.mark.parametrize("kernel", sorted(BACKENDS))
def test_hopper_tables_follow_the_measured_kernels(kernel):
    """torch's FlashAttention-2 and cuDNN kernels measured on a lent H200 (causal, head dim
    128, 512-32,768 keys, benchmarks/attention_kernels.py): each pass's efficiency and half
    length reproduce all 7 lengths within 3 % (fa2) and 4 % (cudnn); the backward's half
    length is 2-2.5x the forward's, which one shared half length could not follow."""
    rows = [r for r in ROWS if r["backend"] == BACKENDS[kernel] and r["causal"]
            and r["head_dim"] == 128]  # fmt: skip
    assert len(rows) == 7
    entry = H100.attention_kernels[kernel]
    assert 2 <= entry["backward_half_seq"] / entry["half_seq"] <= 2.5
    for r in rows:
        for phase in ("forward", "backward"):
            measured = r[f"{phase}_flops"] / r[f"{phase}_s"]
            got = H100.attention_peak("bf16", kernel, phase, r["seq"])
            bound = 0.03 if kernel == "fa2" else 0.04
            assert got == pytest.approx(measured, rel=bound), (kernel, phase, r["seq"])


def test_rate_saturates_with_the_key_length():
    """peak x efficiency x T / (T + half_seq): half the long-sequence rate at T = half_seq."""
    entry = H100.attention_kernels["fa3"]
    full = H100.attention_peak("bf16", "fa3", "forward")
    assert full == pytest.approx(H100.peak("bf16") * entry["forward"])
    half = H100.attention_peak("bf16", "fa3", "forward", entry["half_seq"])
    assert half == pytest.approx(full / 2)


def test_auto_is_the_devices_first_kernel_and_devices_without_a_table_keep_one_rate():
    assert H100.attention_peak("bf16", "auto", "backward", 4096) == H100.attention_peak(
        "bf16", "fa2", "backward", 4096
    )
    tpu = get_hardware("tpu-v5p")
    one = tpu.attention_peak("bf16")
    assert tpu.attention_peak("bf16", "auto", "backward", 512) == one


def _step(kernel: str, seq: int = 16384, cp: int = 1, attention: str = "flash") -> dict:
    train = TrainSpec(batch=8, seq=seq, attention=attention, attention_kernel=kernel)
    return estimate(get_model("llama3-8b"), train, ParallelSpec(fsdp=2, cp=cp), H100)


def test_step_time_orders_the_kernels_as_their_rates():
    """At 16k tokens the attention core is ~30 % of the FLOPs: faster kernels, faster steps;
    the matmuls and everything else are unchanged."""
    times = {k: _step(k)["time_s.step"] for k in ("triton-2022", "fa2", "cudnn", "fa3")}
    assert times["triton-2022"] > times["fa2"] > times["cudnn"] > times["fa3"]
    fa2, fa3 = _step("fa2"), _step("fa3")
    assert fa2["roofline.ffn.time_s"] == fa3["roofline.ffn.time_s"]


def test_backward_core_runs_at_the_backward_rate():
    """Backward seconds of the fused core = 5/2 x its forward FLOPs / C_attn_b: slowing only
    the backward efficiency adds exactly that difference per layer and micro-batch."""
    fast = dataclasses.replace(H100, attention_kernels={"fa2": {"forward": 0.4, "backward": 0.4}})
    slow = dataclasses.replace(H100, attention_kernels={"fa2": {"forward": 0.4, "backward": 0.2}})
    model, train = get_model("llama3-8b"), TrainSpec(batch=1, seq=8192)
    a, b = (estimate(model, train, ParallelSpec(), hw) for hw in (fast, slow))
    assert a["roofline.attn_core.time_s"] == b["roofline.attn_core.time_s"]
    assert a["time_s.forward"] == pytest.approx(b["time_s.forward"])
    core_flops = a["roofline.attn_core.time_s"] * 0.4 * H100.peak("bf16")  # compute-bound
    extra = model.n_layers * 2.5 * core_flops * (1 / 0.2 - 1 / 0.4) / H100.peak("bf16")
    assert b["time_s.backward"] - a["time_s.backward"] == pytest.approx(extra, rel=1e-9)


def test_context_parallel_calls_see_the_chunk_length():
    """Ring attention runs T/cp-key blocks: the rate is the table's at T/cp (same
    sequences per device, a quarter of the queries each)."""
    one, four = _step("fa3", seq=16384, cp=1), _step("fa3", seq=16384, cp=4)
    rate = H100.attention_peak("bf16", "fa3", "forward", 4096)
    full = H100.attention_peak("bf16", "fa3", "forward", 16384)
    per_device = four["roofline.attn_core.time_s"] * rate
    assert per_device * 4 == pytest.approx(one["roofline.attn_core.time_s"] * full, rel=1e-9)


def test_naive_attention_ignores_the_kernel_name():
    fa3, fa2 = (_step(k, seq=2048, attention="naive") for k in ("fa3", "fa2"))
    assert fa3.values == fa2.values


def test_a_kernel_the_device_has_no_rate_for_is_one_clear_error():
    with pytest.raises(SpecError, match=r"attention_kernel 'fa3'.*has: fa2, triton-2022"):
        estimate(
            get_model("llama3-8b"),
            TrainSpec(attention_kernel="fa3"),
            ParallelSpec(),
            get_hardware("a100-80gb"),
        )
    with pytest.raises(SpecError, match="attention_kernel must be one of"):
        TrainSpec(attention_kernel="fa4")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"fa5": {"forward": 0.3, "backward": 0.3}}, "must be one of"),
        ({"fa2": {"forward": 0.3}}, "needs forward and backward"),
        ({"fa2": {"forward": 1.3, "backward": 0.3}}, r"must be in \(0, 1\]"),
        ({"fa2": {"forward": 0.3, "backward": 0.3, "tile": 64}}, "key must be one of"),
    ],
)
def test_bad_kernel_tables_name_the_field(table, message):
    fields = {f.name: getattr(H100, f.name) for f in dataclasses.fields(Hardware)}
    with pytest.raises(SpecError, match=message):
        Hardware(**{**fields, "attention_kernels": table})
