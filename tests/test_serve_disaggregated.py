"""Disaggregated prefill and decode in ``serve`` (issue 40, item 2): the cache hand-off in
bytes and seconds, each pool's capacity from the same estimates as colocated serving, the
deployment limited by the slower pool, and bad input refused naming the field."""

from __future__ import annotations

import pytest

from costmodel import get_hardware, get_model
from costmodel.cli import main
from costmodel.serving.disaggregated import handoff_s, prefill_spec
from costmodel.serving.estimate import serve
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT, ENGINES
from costmodel.specs.serving import ServeSpec

PREFILL_CHUNK = ENGINES[DEFAULT].token_budget

H100 = get_hardware("h100-sxm")
MODEL = get_model("llama3-70b")
BASE = dict(input=4000, output=500, batch=64, tp=4, dp=2, precision="fp8")


def test_the_handoff_moves_one_copy_of_the_prompts_cache_over_the_network():
    """Llama-3-70B: 80 layers x 2 x 8 kv heads x 128 x 2 B = 327,680 B a token, whole (not
    the tp 4 share a device holds), from the prefill replica's 2 devices at once."""
    spec = ServeSpec(**BASE, prefill_replicas=1, prefill_tp=2)
    nbytes = 4000 * 80 * 2 * 8 * 128 * 2
    rate = 2 * H100.network_bw * H100.eff("network")
    assert handoff_s(MODEL, spec, H100) == pytest.approx(H100.network_latency_s + nbytes / rate)


def test_each_pool_is_its_colocated_estimate_and_the_slower_one_limits():
    spec = ServeSpec(**BASE, prefill_replicas=2, prefill_tp=2)
    v = serve(MODEL, spec, H100).values
    step = serve(MODEL, prefill_spec(spec, PREFILL_CHUNK), H100).values
    assert v["disaggregated.prefill_prompts_per_step"] == 2  # 8,192 // 4,000
    assert v["disaggregated.prefill_step_s"] == step["time_s.ttft"]
    prefill = 2 * 2 / step["time_s.ttft"]
    colocated = serve(MODEL, ServeSpec(**BASE), H100).values
    assert v["time_s.tpot"] == colocated["time_s.tpot"]  # the decode step is the same
    decode = 2 * 64 / 499 / v["time_s.tpot"]
    assert v["disaggregated.prefill_requests_per_s"] == pytest.approx(prefill)
    assert v["disaggregated.decode_requests_per_s"] == pytest.approx(decode)
    assert v["throughput.output_tokens_per_s"] == pytest.approx(min(prefill, decode) * 500)
    # a static batch of 2 x 64 prompts waits for waves of 2 replicas x 2 prompts: 32 waves
    assert v["disaggregated.prefill_waves_mean"] == pytest.approx(16.5)
    first = step["time_s.ttft"] * 16.5 + handoff_s(MODEL, spec, H100)
    assert v["time_s.ttft"] == pytest.approx(first)
    assert v["time_s.e2e"] == pytest.approx(v["time_s.ttft"] + 499 * v["time_s.tpot"])
    assert v["throughput.output_tokens_per_s_per_gpu"] == pytest.approx(
        v["throughput.output_tokens_per_s"] / (4 * 2 + 2 * 2)
    )
    # more prefill replicas help until the decode pool limits
    balance = v["disaggregated.prefill_replicas_to_balance"]
    key = "throughput.output_tokens_per_s"
    rates = [serve(MODEL, ServeSpec(**BASE, prefill_replicas=n, prefill_tp=2), H100).values[key]
             for n in (1, 2, 3, 8)]  # fmt: skip
    assert rates[0] < rates[1] < rates[2] and 3 < balance < 8
    assert rates[3] == pytest.approx(decode * 500)


def test_a_prefill_replica_that_does_not_fit_makes_the_answer_not_fit(capsys):
    spec = ServeSpec(**{**BASE, "precision": "bf16"}, prefill_replicas=1, prefill_tp=1)
    v = serve(MODEL, spec, H100).values  # 70B in bf16 on one H100: 141 GB of weights
    assert not v["disaggregated.prefill_fits"] and not v["fits"]
    argv = ["serve", "--model", "llama3-70b", "--input", "4000", "--output", "500", "--tp", "4",
            "--prefill-replicas", "1", "--prefill-tp", "1"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "a prefill replica does NOT fit" in out


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--prefill-tp", "2"], "prefill_tp"),
        (["--prefill-replicas", "1", "--prefill-tp", "3"], "prefill_tp"),
        (["--prefill-replicas", "1", "--prefill-tp", "16"], "prefill_tp"),
        (["--prefill-replicas", "-1"], "prefill_replicas"),
    ],
)
def test_bad_pool_input_is_one_line_naming_the_field(flags, field, refused):
    base = ["serve", "--model", "llama3-70b", "--context", "4096", "--tp", "8"]
    assert "--" + field.replace("_", "-") in refused([*base, *flags])
    with pytest.raises(SpecError, match="prefill_tp"):
        ServeSpec(input=10, output=10, prefill_tp=2)


def test_a_static_batch_waits_for_the_prefill_pools_waves():
    """Issue 60's probe: TTFT was one prefill step whatever the prefill replicas (665 ms for
    96 prompts on 1, 3 or 12 replicas); a static batch now waits for its wave, and more
    replicas (fewer waves) bring TTFT down to one step where one wave holds the batch."""
    ttft = [serve(MODEL, ServeSpec(**BASE, prefill_replicas=n, prefill_tp=2), H100).values
            for n in (1, 4, 64)]  # fmt: skip
    assert ttft[0]["time_s.ttft"] > ttft[1]["time_s.ttft"] > ttft[2]["time_s.ttft"]
    assert ttft[2]["disaggregated.prefill_waves_mean"] == 1.0  # 64 x 2 prompts: one wave
