"""Workloads as benchmarks state them (``costmodel.serving.queueing``, issue 59): random
arrivals at a rate and a closed loop of users, simulated request by request over the same
step model as ``serve``."""

from __future__ import annotations

import pytest

from costmodel import get_hardware, get_model
from costmodel import serve as cm_serve
from costmodel.answers.serve import spec_of
from costmodel.cli import main
from costmodel.serving.estimate import serve
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT, ENGINES
from costmodel.specs.serving import ServeSpec

TOKEN_BUDGET = ENGINES[DEFAULT].token_budget

LLAMA, H100 = get_model("llama3-8b"), get_hardware("h100-sxm")


def _at(rate: float, **kw) -> dict:
    spec = ServeSpec(input=1000, output=200, batch=256, arrival="poisson", request_rate=rate,
                     **kw)  # fmt: skip
    return serve(LLAMA, spec, H100).values


def test_a_light_load_is_one_request_alone():
    """At 0.2 requests/s a request rarely meets another: TTFT is one prompt's prefill and
    TPOT one sequence's decode step, as the static batch of 1 prices them."""
    v = _at(0.2, requests=200)
    alone = serve(LLAMA, ServeSpec(input=1000, output=200, batch=1), H100).values
    assert v["workload.ttft_s.p50"] == pytest.approx(alone["time_s.ttft"], rel=0.05)
    assert v["workload.tpot_s.p50"] == pytest.approx(alone["time_s.tpot"], rel=0.05)
    assert v["workload.requests_per_s"] == pytest.approx(0.2, rel=0.25)


def test_latency_grows_with_the_rate_and_past_capacity_the_queue_does():
    """More requests a second: longer TPOT (bigger iterations) and TTFT; past what the
    engine serves, requests wait in the queue (TTFT of seconds) and it serves its capacity."""
    light, busy, over = _at(2.0), _at(15.0), _at(60.0)
    assert light["workload.tpot_s.mean"] < busy["workload.tpot_s.mean"]
    assert light["workload.ttft_s.p99"] < busy["workload.ttft_s.p99"] < 1.0
    assert over["workload.ttft_s.mean"] > 2.0 and over["workload.requests_per_s"] < 60.0
    for v in (light, busy, over):
        assert (v["workload.ttft_s.p50"] <= v["workload.ttft_s.p90"]
                <= v["workload.ttft_s.p99"])  # fmt: skip
        assert v["time_s.ttft"] == v["workload.ttft_s.mean"]  # the answer's times are these


def test_the_same_question_gives_the_same_numbers_and_replicas_share_the_rate():
    assert _at(10.0) == _at(10.0)
    two = _at(20.0, dp=2)
    assert two["workload.requests_per_s"] == pytest.approx(2 * _at(10.0)["workload.requests_per_s"],
                                                           rel=0.1)  # fmt: skip


def test_a_closed_loop_keeps_its_users_in_flight():
    """C users and no think time: Little's law holds exactly, C = served x end to end."""
    spec = ServeSpec(input=1000, output=200, batch=256, arrival="continuous", concurrency=32)
    v = serve(LLAMA, spec, H100).values
    assert v["workload.requests_per_s"] * v["workload.e2e_s.mean"] == pytest.approx(32, rel=0.05)
    # all 32 prompts (32,000 tokens) prefill in iterations of the budget before a first token
    assert v["workload.ttft_s.mean"] > (32 * 1000 // TOKEN_BUDGET) * v["workload.tpot_s.mean"]


def test_defaults_follow_what_the_user_gives():
    assert spec_of({"input": 10, "output": 5, "request_rate": 1.0}).arrival == "poisson"
    assert spec_of({"input": 10, "output": 5, "concurrency": 8}).arrival == "continuous"
    assert spec_of({"input": 10, "output": 5, "concurrency": 8}).batch == ENGINES[DEFAULT].max_seqs
    sglang = spec_of({"input": 10, "output": 5, "concurrency": 8, "engine": "sglang"})
    assert sglang.batch == ENGINES["sglang"].max_seqs
    with pytest.raises(SpecError, match="concurrency") as err:
        ServeSpec(input=10, output=5, arrival="continuous", concurrency=8, request_rate=1.0)
    assert err.value.field == "concurrency"
    with pytest.raises(SpecError) as err:
        ServeSpec(input=10, output=5, arrival="poisson")
    assert err.value.field == "arrival"
    with pytest.raises(SpecError) as err:
        ServeSpec(input=10, output=5, arrival="poisson", request_rate=1.0, requests=10**6)
    assert err.value.field == "requests"


def test_the_cli_prints_the_spread_and_the_workload(capsys):
    assert main(["serve", "--model", "llama3-8b", "--input", "1000", "--output", "200",
                 "--request-rate", "5", "--requests", "300"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "5 requests/s at random of (1,000 in + 200 out)" in out
    for row in ("TTFT (queue + prefill)  mean", "TPOT (after the first)  mean", "served"):
        assert row in out, row
    assert "p99" in out and "a benchmark of 300 requests" in out
    assert "over the run of 300 (drain included;" in out


def test_served_is_the_rate_offered_below_capacity_whatever_the_requests():
    """Issue 60's probe: served counted the drain after the last arrival, so a light load
    read 10-20 % below its rate, by how few requests were simulated. Now it is the rate the
    seeded draw offers, and past capacity the note says the queue grows."""
    for n in (200, 1000, 3000):
        v = _at(2.0, requests=n)
        assert v["workload.sustained_per_s"] == pytest.approx(v["workload.offered_per_s"])
        assert v["workload.offered_per_s"] == pytest.approx(2.0, rel=0.15)
    steady = _at(2.0)
    assert steady["workload.requests_per_s"] == steady["workload.sustained_per_s"] == 2.0
    spec = spec_of({"input": 1000, "output": 200, "request_rate": 100.0})
    answer = serve(LLAMA, spec, H100)
    assert "OVERLOADED: 100 requests/s offered" in " ".join(answer.notes)
    assert answer["workload.requests_per_s"] < 50


def test_a_closed_loops_first_wave_is_not_its_steady_state():
    """256 users all send at once: that burst's waits (4.8 s at p90) set the percentiles
    while only the first tenth of 1,000 requests was left out; the first wave is now left
    out, so 1,000 and 10,000 requests agree. As many users as requests is one burst, counted
    whole (a benchmark of that many prompts)."""
    short = serve(LLAMA, spec_of({"input": 1000, "output": 200, "concurrency": 256}), H100)
    long = serve(LLAMA, spec_of({"input": 1000, "output": 200, "concurrency": 256,
                                 "requests": 10000}), H100)  # fmt: skip
    assert short["workload.ttft_s.p90"] < 0.5 and long["workload.ttft_s.p90"] < 0.5
    assert short["workload.counted"] == 1000 - 256  # the steady state's 1,000
    assert long["workload.counted"] == 10000  # a benchmark counts every request
    burst = serve(LLAMA, spec_of({"input": 1000, "output": 200, "concurrency": 100,
                                  "requests": 100}), H100)  # fmt: skip
    assert burst["workload.counted"] == 100
    assert any("one burst" in n for n in burst.notes)


@pytest.mark.parametrize("dp", [1, 4, 8])
def test_replicas_below_capacity_serve_the_rate_offered(dp):
    """Issue 60's probe: 20 requests/s over 4 replicas was served at 17.6 (8: 18.6). Each
    replica simulates the same seeded draw of 1,000/dp arrivals, whose own rate is a few
    percent off the one asked; below capacity the deployment serves what is offered."""
    v = _at(20, dp=dp)
    assert v["workload.requests_per_s"] == v["workload.offered_per_s"] == 20


@pytest.mark.parametrize("dp", [1, 3])
def test_a_rate_past_capacity_is_overloaded_however_short_the_window(dp):
    """The second probe: 1,000 requests over 3 replicas of 381 slots never built a queue, so
    300 requests/s read as served at a rate 4x what the deployment sustains. An open loop
    serves at most the steady-state capacity (the continuous model's), and says so."""
    v = _at(300, dp=dp, requests=1000)
    capacity = v["workload.capacity_per_s"]
    assert v["workload.requests_per_s"] <= capacity < 0.9 * 300
    answer = cm_serve("llama3-8b", input=1000, output=200, request_rate=300, dp=dp)
    assert answer.overloaded and "OVERLOADED" in repr(answer)


def test_requests_without_a_workload_is_refused(refused):
    """The second probe: --requests without a rate or users was ignored without a word."""
    said = refused(["serve", "--model", "llama3-8b", "--input", "100", "--output", "10",
                    "--requests", "5"])  # fmt: skip
    assert (
        "--requests makes a simulated workload a benchmark of that many: give "
        "--request-rate or --concurrency"
    ) in said


def test_a_benchmark_of_n_requests_is_measured_over_its_run():
    """vLLM's and SGLang's bench_serving divide the requests by the run, first send to last
    completion: a short benchmark's drain after its last arrival (a request's end to end)
    lowers its throughput below the rate offered, less the more requests it holds (SGLang's
    200 requests at 16/s read 2-3x below the rate, issue 59). The sustained rate stays."""
    short, long = _at(5.0, requests=50), _at(5.0, requests=2000)
    for v in (short, long):
        assert v["workload.counted"] == v["workload.requests"]
        assert v["workload.sustained_per_s"] == v["workload.offered_per_s"] == 5.0
        assert v["workload.requests_per_s"] < v["workload.offered_per_s"]
    assert short["workload.requests_per_s"] < 0.85 * 5.0  # 50 arrivals over ~10 s, ~2 s drain
    assert long["workload.requests_per_s"] == pytest.approx(5.0, rel=0.05)
    answer = cm_serve("llama3-8b", input=1000, output=200, request_rate=5, requests=50)
    assert not answer.overloaded  # a drain is not a queue


def test_a_benchmark_has_at_least_one_request_a_user():
    """A probe: --concurrency 32 --requests 1 was headlined as 32 users with one in flight."""
    with pytest.raises(SpecError) as err:
        spec_of({"input": 1000, "output": 200, "concurrency": 32, "requests": 1})
    assert err.value.field == "requests" and "concurrency=32" in str(err.value)


def test_a_length_spread_draws_each_request_as_benchmarks_do():
    """Issue 59 ("workloads as benchmarks state them"): SGLang's bench_serving draws a
    random dataset's lengths uniformly up to the stated ones and vLLM's within
    L x (1 +- r). ``length_spread`` draws each request's prompt and output within the
    stated x (1 +- s), seeded, whole tokens, and the longest outputs set a benchmark's drain:
    the same mean lengths serve fewer tokens a second than every request at the mean."""
    from dataclasses import replace

    import numpy as np

    from costmodel.serving.queueing import lengths

    spec = ServeSpec(input=1000, output=200, batch=256, arrival="poisson", request_rate=8.0,
                     requests=200, length_spread=1.0)  # fmt: skip
    drawn = np.array(lengths(spec, np.random.default_rng(0), 4000))
    assert drawn[:, 0].min() >= 1 and drawn[:, 0].max() <= 2000 and drawn[:, 1].max() <= 400
    assert drawn.mean(axis=0) == pytest.approx([1000, 200], rel=0.03)
    assert (
        lengths(replace(spec, length_spread=0.0), np.random.default_rng(0), 3) == [(1000, 200)] * 3
    )
    spread = serve(LLAMA, spec, H100).values
    again = serve(LLAMA, spec, H100).values  # seeded: the same question, the same numbers
    even = serve(LLAMA, replace(spec, length_spread=0.0), H100).values
    assert spread["throughput.output_tokens_per_s"] == again["throughput.output_tokens_per_s"]
    assert spread["throughput.output_tokens_per_s"] < even["throughput.output_tokens_per_s"]
    assert spread["workload.tpot_s.p99"] > even["workload.tpot_s.p99"]


def test_a_length_spread_needs_a_simulated_workload():
    with pytest.raises(SpecError, match="length_spread draws each request's lengths"):
        ServeSpec(input=1000, output=200, batch=8, length_spread=0.5)
    with pytest.raises(SpecError, match=r"length_spread must be <= 1"):
        ServeSpec(input=1000, output=200, concurrency=8, arrival="continuous", length_spread=2)


def test_a_rate_the_run_does_not_keep_up_with_is_overloaded():
    """Issue 60's app probe: 5 requests/s offered, 4.61 served, TTFT p99 16 s and growing
    read as a plain "Fits" (the rule was served < 0.9 x offered); 4.5 offered is served
    whole and is not flagged."""
    import costmodel

    over = costmodel.serve("llama3-8b", "h100-sxm", input=2000, output=500, batch=32,
                           request_rate=5)  # fmt: skip
    v = over.estimate.values
    assert v["workload.sustained_per_s"] < 0.95 * 5 and over.overloaded
    steady = costmodel.serve("llama3-8b", "h100-sxm", input=2000, output=500, batch=32,
                             request_rate=4.5)  # fmt: skip
    assert steady.estimate.values["workload.sustained_per_s"] == 4.5 and not steady.overloaded


def test_a_rate_prices_the_cache_its_load_holds_as_users_and_steady_states_do(capsys):
    """Issue 60's fifth probe: at 5 requests/s the simulated answer showed the whole pool
    (55.78 GiB of cache, the engine's cap of sequences), the steady state 1.72 GiB and 64
    users 10 GiB: three meanings of one line. Each now holds the cache of its load's mean
    in flight a replica."""
    import json

    from costmodel.cli import main

    base = ["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--input", "1024",
            "--output", "256", "--json"]  # fmt: skip
    assert main([*base, "--request-rate", "5"]) == 0
    rated = json.loads(capsys.readouterr().out)
    held = rated["workload"]["in_flight"]
    per_seq = rated["kv_bytes_per_sequence"]
    assert rated["memory_bytes_per_device"]["kv_cache"] == held * per_seq
    assert (
        rated["memory_bytes_per_device"]["kv_cache"]
        < 0.1 * rated["memory_bytes_per_device"]["budget"]
    )


def test_users_queued_behind_a_cap_are_said_to_wait_for_the_cap(capsys):
    """Issue 60's fifth probe: 64 users under --batch 8 read "QUEUED (56 ... wait for a
    slot: 357 sequences fit at once)", blaming memory, and the cap left the assumptions."""
    from costmodel.cli import main

    argv = ["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--input", "1024",
            "--output", "256", "--concurrency", "64", "--batch", "8"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "wait for a slot: a replica holds 8 at once (the --batch or engine cap; 357 fit" in out
    assert "assumptions             at most 8 in flight a replica (--batch)" in out
