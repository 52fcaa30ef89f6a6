"""``costmodel.serve``: the CLI's serving question in Python, with its names and defaults
(issue 60: there was no top-level serve, and the subpackage held the name)."""

from __future__ import annotations

import json

import pytest

import costmodel
from costmodel.cli import main
from costmodel.engine.quantities import flat
from costmodel.specs.engines import DEFAULT, ENGINES


def test_serve_in_python_is_the_cli_answer(capsys):
    ans = costmodel.serve("llama3-70b", hardware="h100-sxm", tp=4, input=2000, output=500,
                          batch=32)  # fmt: skip
    assert (
        main(
            [
                "serve",
                "--model",
                "llama3-70b",
                "--hardware",
                "h100-sxm",
                "--tp",
                "4",
                "--input",
                "2000",
                "--output",
                "500",
                "--batch",
                "32",
                "--json",
            ]
        )
        == 0
    )
    cli = flat(json.loads(capsys.readouterr().out))
    assert ans.fits is cli["verdict.fits"] is True
    for key in ("time_s.ttft", "time_s.tpot", "throughput.output_tokens_per_s", "max_batch"):
        assert ans[key] == cli[key], key
    assert repr(ans).startswith("ServeAnswer(fits: up to 200 sequences fit; TTFT 5.008 s")


def test_the_repr_counts_in_the_clis_words(capsys):
    """Issue 60's leftover: where not one sequence's cache fits beside the weights the repr
    said "does not fit: 0 sequences fit" while the CLI says it in words; over replicas it
    gave one replica's count. The repr's count is the CLI's verdict's, from one function."""
    none = costmodel.serve("llama3-70b", hardware="h100-sxm", context=4096)
    assert main(["serve", "--model", "llama3-70b", "--hardware", "h100-sxm", "--context",
                 "4096"]) == 0  # fmt: skip
    verdict = next(x for x in capsys.readouterr().out.splitlines() if "verdict" in x)
    said = "the weights alone do not fit the engine's share of a device (a larger tp)"
    assert none.how_many() == said and said in verdict  # 141 GB of weights (a sixth probe)
    assert repr(none).startswith(f"ServeAnswer(does NOT fit: {said}; nearest fit: precision ")
    assert "0 sequences" not in repr(none)
    two = costmodel.serve("llama3-70b", hardware="h200", tp=8, gpus=16, input=2000, output=500,
                          batch=32)  # fmt: skip
    count = f"up to {two['max_batch']:,} sequences fit a replica ({2 * two['max_batch']:,} over"
    assert repr(two).startswith(f"ServeAnswer(fits: {count} the 2 replicas); TTFT")


def test_serve_takes_the_cli_defaults():
    """Context alone: the last 128 tokens generated, one request at a time; at a request
    rate, random arrivals simulated (at most the engine's max_num_seqs in flight, or what
    fits)."""
    one = costmodel.serve("llama3-8b", context=4096)
    assert one["time_s.tpot"] > 0 and one.estimate["max_batch"] >= 1
    rated = costmodel.serve("llama3-8b", input=1000, output=200, request_rate=1.0)
    most = min(ENGINES[DEFAULT].max_seqs, rated.estimate["max_batch"])
    assert "workload.ttft_s.p99" in rated
    assert rated.estimate.notes[0] == "hardware h100-sxm, the default: set hardware"
    assert f"at most {most} in flight" in rated.estimate.notes[1]
    given = costmodel.serve("llama3-8b", "h100-sxm", input=1000, output=200, request_rate=1.0)
    assert given.estimate.notes == rated.estimate.notes[1:]


def test_a_batch_that_does_not_fit_names_the_nearest_and_shows_no_times():
    ans = costmodel.serve("mixtral-8x7b", context=4096, batch=512)
    assert not ans.fits and ans.nearest and "mixture-of-experts" in ans.caveats[0]
    assert "TTFT" not in repr(ans) and "nearest fit: tp 8 gpus 8 fits" in repr(ans)  # API names


def test_the_json_of_a_batch_that_does_not_fit_has_its_memory_and_no_times(capsys):
    """``--json`` says what the text says: memory and the nearest fit, no TTFT, TPOT or
    throughput for a batch that does not fit (issue 60's probe: it printed them)."""
    assert main(["serve", "--model", "llama3-8b", "--context", "4096", "--batch", "512",
                 "--json"]) == 0  # fmt: skip
    out = flat(json.loads(capsys.readouterr().out))
    assert out["verdict.fits"] is False and out["verdict.nearest"]
    assert out["memory_bytes_per_device.total"] > out["memory_bytes_per_device.budget"]
    assert not [k for k in out if k.startswith(("time_s.", "throughput."))]
    assert main(["serve", "--model", "llama3-8b", "--context", "4096", "--json"]) == 0
    assert "time_s.tpot" in flat(json.loads(capsys.readouterr().out))


@pytest.mark.parametrize(("inputs", "field"), [({"inputs": 3}, "inputs"),
                                               ({"batch": 0, "context": 4096}, "batch"),
                                               ({"output": 10}, "context")])  # fmt: skip
def test_a_wrong_serving_input_names_its_field(inputs, field):
    with pytest.raises(costmodel.SpecError) as err:
        costmodel.serve("llama3-8b", **inputs)
    assert err.value.field == field


def test_the_cli_names_the_defaults_it_took(capsys):
    """``--input`` alone: 128 generated tokens and one request at a time, each said with
    its flag (the output's default went unsaid where only the input was given)."""
    assert main(["serve", "--model", "llama3-8b", "--input", "2000"]) == 0
    said = capsys.readouterr().out
    assert "128 generated tokens (default; --output)" in said
    assert "one request at a time (default; --batch)" in said
    assert "engine vLLM V1 (asynchronous scheduling) (default; --engine)" in said
    assert main(["serve", "--model", "llama3-8b", "--input", "2000", "--output", "100",
                 "--batch", "4", "--engine", "vllm"]) == 0  # fmt: skip
    assert "(default;" not in capsys.readouterr().out


def test_serve_takes_gpus_as_the_other_commands_do():
    """Issue 60's probe: ``serve`` had no ``--gpus``; it now fills the replicas (dp) with
    what tp x pp leave, and refuses a count they do not divide or a dp that disagrees."""
    ans = costmodel.serve("llama3-8b", gpus=8, tp=2, input=1000, output=100)
    same = costmodel.serve("llama3-8b", dp=4, tp=2, input=1000, output=100)
    assert ans["throughput.output_tokens_per_s"] == same["throughput.output_tokens_per_s"]
    for inputs, says in (({"gpus": 7, "tp": 2}, "must be a multiple of tp x pp (2)"),
                         ({"gpus": 8, "tp": 2, "dp": 2}, "must be tp x pp x dp (4)")):  # fmt: skip
        with pytest.raises(costmodel.SpecError) as err:
            costmodel.serve("llama3-8b", input=1000, output=100, **inputs)
        assert err.value.field == "gpus" and says in str(err.value)


def test_a_closed_loop_fits_when_its_users_do_and_says_when_they_queue():
    """Issue 60's fourth probe: 32 users of Llama-3-70B on one H100 suggested fp8 weights
    as fitting "the batch of 1,024" (the engine's cap), where 3 sequences fit and 29 users
    then wait minutes; the verdict of that run was a plain "fits". The nearest fit now holds
    the users, and a closed loop whose users a replica cannot all hold is QUEUED, as an
    open loop past its capacity is OVERLOADED, in the CLI, the app and the repr alike."""
    asked = {"hardware": "h100-sxm", "concurrency": 32, "input": 2000, "output": 500}
    ans = costmodel.serve("llama3-70b", **asked)
    assert not ans.fits and ans.nearest == "tp 4 gpus 4 holds the 32 users a replica at once"
    held = costmodel.serve("llama3-70b", **asked, tp=4)
    assert held.headline() == "fits" and held["max_batch"] >= 32
    queued = costmodel.serve("llama3-70b", **asked, precision="fp8")
    waiting = 32 - queued["max_batch"]
    assert queued.fits and queued["workload.users_waiting"] == waiting > 0
    assert queued.headline().startswith(f"fits, but QUEUED ({waiting} of each replica's users")
    assert "QUEUED" in repr(queued)


def test_a_static_batch_says_its_prompts_are_not_chunked_by_the_token_budget():
    """Issue 60's fourth probe: ``--batch 8 --token-budget 1`` echoed "at most 1 tokens an
    iteration" beside the TTFT of budgets 512 and 8,192. A static batch is priced with its
    prompts prefilled together, and the assumptions say so where the budget would chunk
    them; a closed loop chunks them (its TTFT moves with the budget)."""
    from costmodel.answers.serve import spec_of
    from costmodel.answers.serve_words import assumptions

    said = assumptions(spec_of({"input": 2000, "output": 500, "batch": 8, "token_budget": 1}),
                       False, False, False)  # fmt: skip
    assert (
        "at most 1 tokens an iteration for prompts arriving over time, not applied to this "
        "batch's prefill: its prompts are priced prefilled together" in said
    )
    loop = spec_of({"input": 2000, "output": 500, "concurrency": 8, "token_budget": 1})
    assert "priced prefilled together" not in assumptions(loop, False, False, False)


@pytest.mark.parametrize(
    ("given", "model", "batch"),
    [(["--gpus", "2", "--tp", "2"], "llama3-70b", "64"),
     (["--gpus", "8", "--tp", "2"], "llama3-70b", "400"),
     (["--gpus", "4"], "llama3-8b", "1000")],
)  # fmt: skip
def test_a_nearest_fit_with_gpus_given_runs_as_printed(given, model, batch, capsys):
    """Issue 60's third probe: with --gpus given, the nearest fit said "--tp 4", which then
    failed ("--gpus (2) must be a multiple of --tp x --pp (4)"): a larger tp now keeps the
    devices (fewer replicas) or names the devices it needs, so its flags run as printed."""
    argv = ["serve", "--model", model, "--hardware", "h100-sxm", "--input", "2000",
            "--output", "500", "--batch", batch, *given]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    near = json.loads(capsys.readouterr().out)["verdict"]["nearest"]
    flags = near.split(" fits")[0].split()
    assert main([*argv, *flags, "--json"]) == 0, near
    assert json.loads(capsys.readouterr().out)["verdict"]["fits"], near


def test_a_device_no_serving_run_checks_gets_the_caveat():
    """Issue 60's third probe: serve on tpu-v6e had no caveat (its training runs calibrate
    it, but no serving run does); the devices named are the serving corpus's own."""
    from pathlib import Path

    from costmodel.answers.serve import SERVED_ON

    corpus = Path(__file__).parents[1] / "validate" / "published" / "serving_runs.json"
    data = json.loads(corpus.read_text())
    runs = data["runs"] if isinstance(data, dict) else data
    assert set(SERVED_ON) == {r["hardware"] for r in runs}
    tpu = costmodel.serve("llama3-8b", "tpu-v6e", input=1000, output=200, batch=8)
    assert any("no published serving run checks serving on it" in c for c in tpu.caveats)
    gpu = costmodel.serve("llama3-8b", "h100-sxm", input=1000, output=200, batch=8)
    assert not gpu.caveats


def test_one_generated_token_is_limited_by_the_prefill_and_has_no_tpot(capsys):
    """Issue 60's fourth probe: output 1 said "limited by decode (51 %)" with a TPOT, though
    no decode step follows the prefill's one token."""
    assert main(["serve", "--model", "llama3-8b", "--input", "2000", "--output", "1",
                 "--batch", "8"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "limited by             the prefill: one token is generated" in out
    assert "TPOT (decode step)     none: one token, no decode" in out


def test_an_unfit_serve_names_the_cause_and_the_change_that_holds_the_most():
    """Issue 60's sixth probe: Llama-3-405B's weights over tp 8 (101 GB a device) read "not
    one sequence's cache fits beside the weights"; and a 100k context at tp 2 answered "no
    batch fits on one node" where tp 8 holds 14 and tp 8 in fp8 33."""
    big = costmodel.serve("llama3-405b", hardware="h100-sxm", tp=8, input=1000, output=100,
                          batch=4)  # fmt: skip
    assert big.how_many().startswith("the weights alone do not fit")
    long = costmodel.serve("llama3-70b", hardware="h100-sxm", tp=2, input=100000, output=100,
                           batch=64, rope_scaling=16)  # fmt: skip
    said = long.how_many()  # what the weights leave, beside the one sequence it is short of
    assert said.startswith("the weights leave 5.24 GiB") and "less than one sequence's" in said
    assert long.nearest.endswith("fits 33 at once (of the 64 asked)") and "tp 8" in long.nearest
