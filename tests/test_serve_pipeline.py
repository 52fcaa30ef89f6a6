"""Pipeline parallelism in ``serve`` (issue 40, item 2): a replica's layers over pp stages,
priced as its last (largest, slowest) stage; weights and cache per device exact, TPOT as pp
stage steps of a micro-batch and their sends, prefill as the pipeline's fill and drain, and
what is not modelled with pp refused naming it."""

from __future__ import annotations

import math

import pytest

from costmodel import get_hardware, get_model
from costmodel.serving.estimate import serve
from costmodel.serving.pipeline import send_s, stage_model
from costmodel.specs.serving import ServeSpec

H100 = get_hardware("h100-sxm")
LLAMA = get_model("llama3-70b")
SPEC = ServeSpec(input=2000, output=500, batch=32, tp=4, pp=2)


def test_a_stage_holds_half_the_blocks_and_the_head():
    """Llama-3-70B over tp 4 x pp 2: 40 blocks (q, o 8192^2; k, v 8192 x 1024; SwiGLU 3 x
    8192 x 28672) and the 128,256 x 8192 head over 4 ranks, 40 x 2 norms and the final one
    whole, in bf16; the cache of all 32 sequences for 40 blocks (2 x 8 x 128 a token over 4)."""
    v = serve(LLAMA, SPEC, H100).values
    block = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    weights = 2 * (40 * block // 4 + 128256 * 8192 // 4 + (40 * 2 + 1) * 8192)
    assert v["memory_bytes_per_device.weights"] == weights
    assert v["kv_bytes_per_token"] == 40 * 2 * 8 * 128 * 2 // 4
    assert v["memory_bytes_per_device.kv_cache"] == 32 * 2500 * 40 * 2 * 8 * 128 * 2 // 4
    assert stage_model(get_model("deepseek-v3"), 4).dense_layers == 0  # the last stage routes


def test_tpot_is_pp_stage_steps_of_a_micro_batch_and_prefill_fills_and_drains():
    v = serve(LLAMA, SPEC, H100).values
    stage = stage_model(LLAMA, 2)
    micro = serve(stage, ServeSpec(input=2000, output=500, batch=16, tp=4), H100).values
    send = send_s(LLAMA, SPEC, H100, 16, 2)
    assert send == pytest.approx(H100.link_latency_s + 16 * 8192 * 2 / 4
                                 / (H100.link_bw * H100.eff("link")))  # fmt: skip
    assert v["time_s.tpot"] == pytest.approx(2 * (micro["time_s.tpot"] + send))
    prompts = send_s(LLAMA, SPEC, H100, 16 * 2000, 2)
    assert v["time_s.ttft"] == pytest.approx(3 * (micro["time_s.ttft"] + prompts))
    assert v["throughput.output_tokens_per_s"] == pytest.approx(32 * 500 / v["time_s.e2e"])
    assert v["throughput.output_tokens_per_s_per_gpu"] == pytest.approx(
        v["throughput.output_tokens_per_s"] / 8
    )
    tp8 = serve(LLAMA, ServeSpec(input=2000, output=500, batch=32, tp=8), H100).values
    assert v["time_s.tpot"] > tp8["time_s.tpot"]  # pp reads each stage's weights per micro-batch
    assert math.isclose(v["memory_bytes_per_device.weights"],
                        tp8["memory_bytes_per_device.weights"], rel_tol=1e-3)  # fmt: skip


@pytest.mark.parametrize(
    "flags",
    [
        ["--pp", "81"],
        ["--pp", "2", "--draft-tokens", "2", "--acceptance", "0.8"],
        ["--pp", "2", "--prefill-replicas", "1"],
    ],
)
def test_what_pp_does_not_model_is_one_line_naming_pp(flags, refused):
    base = ["serve", "--model", "llama3-70b", "--context", "4096", "--tp", "4"]
    assert "pp" in refused([*base, *flags])
