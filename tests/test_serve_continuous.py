"""Continuous batching in ``serve --arrival continuous`` (issue 40, item 2): the batch the
iteration token budget keeps in flight, an iteration of the decodes and the prompt chunks
that replace finishing sequences, the sequences a request rate keeps in flight, and the
answer's own words."""

from __future__ import annotations

import math

import pytest

from costmodel import get_hardware, get_model
from costmodel.cli import main
from costmodel.serving.continuous import kept_batch
from costmodel.serving.estimate import decode_step, serve
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT, ENGINES
from costmodel.specs.serving import ServeSpec

TOKEN_BUDGET = ENGINES[DEFAULT].token_budget

H100 = get_hardware("h100-sxm")
LLAMA = get_model("llama3-8b")


def test_the_token_budget_caps_the_batch_the_engine_keeps():
    # 2,048 + 128: each sequence in flight brings 16 prompt tokens an iteration besides its own
    assert kept_batch(ServeSpec(input=2048, output=128, batch=1024)) == math.floor(8192 / 17)
    assert kept_batch(ServeSpec(input=128, output=2048, batch=1024)) == 1024
    assert TOKEN_BUDGET == 8192


def test_an_iteration_is_the_decode_step_plus_its_prompt_tokens():
    spec = ServeSpec(input=1000, output=1000, batch=64, arrival="continuous")
    v = serve(LLAMA, spec, H100).values
    plain = decode_step(LLAMA, ServeSpec(input=1000, output=1000, batch=64), H100)
    assert v["continuous.prompt_tokens_per_iteration"] == 64  # 64 x 1000 / 1000
    # more work than the decode step alone, and a fraction of a static prefill of 64 prompts
    static = serve(LLAMA, ServeSpec(input=1000, output=1000, batch=64), H100).values
    assert plain["phase"]["total"] < v["time_s.tpot"] < plain["phase"]["total"] * 1.2
    assert v["time_s.tpot"] == v["time_s.iteration.total"]
    assert v["throughput.output_tokens_per_s"] == pytest.approx(64 / v["time_s.tpot"])
    assert v["time_s.e2e"] == pytest.approx(v["time_s.ttft"] + 999 * v["time_s.tpot"])
    # chunked prefill rides on memory-bound decode iterations: more throughput than a static batch
    assert v["throughput.output_tokens_per_s"] > static["throughput.output_tokens_per_s"]
    # one request alone: its whole prompt in one iteration, about a static prefill
    one = serve(LLAMA, ServeSpec(input=5000, output=500, arrival="continuous"), H100).values
    alone = serve(LLAMA, ServeSpec(input=5000, output=500), H100).values
    assert one["time_s.ttft"] == pytest.approx(alone["time_s.ttft"], rel=0.05)


def test_the_cli_names_the_kept_batch_and_the_iteration(capsys):
    argv = ["serve", "--model", "llama3-8b", "--input", "2048", "--output", "128", "--batch",
            "1024", "--precision", "fp8", "--arrival", "continuous"]  # fmt: skip
    assert main([*argv, "--tp", "2", "--kv-dtype", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "keeps 481 of 1024 sequences in flight" in out and "iteration budget" in out
    assert "an iteration (decodes and prompt chunks)" in out
    assert main(argv) == 0  # one device's cache holds fewer: the engine admits what it holds
    out = capsys.readouterr().out
    assert "keeps 235 of 1024 sequences in flight: the cache holds no more" in out
    assert "verdict                fits" in out and "up to 235 sequences fit" in out


@pytest.mark.parametrize(
    "flags",
    [["--pp", "2"], ["--draft-tokens", "2", "--acceptance", "0.8"], ["--prefill-replicas", "1"]],
)
def test_what_continuous_does_not_model_is_one_line_naming_arrival(flags, refused):
    base = ["serve", "--model", "llama3-8b", "--context", "4096", "--arrival", "continuous"]
    assert "arrival" in refused([*base, *flags])


def _at(rate: float, dp: int = 1, batch: int = 256):
    spec = ServeSpec(input=1000, output=500, batch=batch, dp=dp, arrival="continuous",
                     request_rate=rate)  # fmt: skip
    return serve(LLAMA, spec, H100).values


def test_a_request_rate_keeps_what_littles_law_says_in_flight():
    """B = λ x end to end at B: the fewest sequences whose time in the engine carries the
    rate (Little 1961); more requests, more in flight and a longer step."""
    low, high = _at(2.0), _at(8.0)
    for rate, v in ((2.0, low), (8.0, high)):
        held = v["continuous.in_flight"]
        assert held >= rate * v["time_s.e2e"]  # enough in flight to carry the rate ...
        fewer = serve(LLAMA, ServeSpec(input=1000, output=500, batch=held - 1,
                                       arrival="continuous"), H100).values  # fmt: skip
        assert held - 1 < rate * fewer["time_s.e2e"]  # ... and one fewer is not
        assert v["throughput.output_tokens_per_s"] == pytest.approx(rate * 500)
    assert low["continuous.in_flight"] < high["continuous.in_flight"]
    assert low["time_s.tpot"] < high["time_s.tpot"]
    # replicas share the rate: two at 2λ hold what one holds at λ
    assert _at(16.0, dp=2)["continuous.in_flight"] == high["continuous.in_flight"]


def test_a_rate_past_what_the_deployment_sustains_is_refused_with_its_capacity():
    most = serve(LLAMA, ServeSpec(input=1000, output=500, batch=64, arrival="continuous"), H100)
    capacity = 64 / most["time_s.e2e"]
    assert _at(1.0, batch=64)["continuous.capacity_requests_per_s"] == pytest.approx(capacity)
    with pytest.raises(SpecError, match=r"request_rate .*exceeds the .* requests/s") as err:
        _at(capacity * 1.01, batch=64)
    assert err.value.field == "request_rate"
    with pytest.raises(SpecError, match="request_rate needs arrival=continuous"):
        ServeSpec(input=10, output=10, request_rate=1.0)


def test_the_cli_answers_at_a_rate_in_its_own_words(capsys):
    assert main(["serve", "--model", "llama3-8b", "--input", "1000", "--output", "500",
                 "--request-rate", "5", "--arrival", "continuous"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "5 requests/s of (1,000 in + 500 out), 22 in flight a replica" in out
    cap = ENGINES[DEFAULT].max_seqs
    assert f"requests arrive at 5/s into continuous batching (at most {cap} in flight" in out
    assert "2,500 (2,500 per GPU)" in out


def test_the_verdict_says_its_count_is_a_replicas(capsys):
    """A probe: tp 8 x dp 2 printed "up to 1,147 sequences fit", one replica's count, where
    the deployment holds twice that; one replica's verdict keeps the plain count."""
    argv = ["serve", "--model", "llama3-70b", "--hardware", "h200", "--tp", "8", "--input",
            "2000", "--output", "500", "--concurrency", "64"]  # fmt: skip
    assert main([*argv, "--gpus", "16"]) == 0
    two = capsys.readouterr().out
    assert "up to 1,147 sequences fit a replica (2,294 over the 2 replicas)" in two
    assert main([*argv, "--gpus", "8"]) == 0
    verdict = next(x for x in capsys.readouterr().out.splitlines() if "verdict" in x)
    assert verdict.endswith("up to 1,147 sequences fit")
