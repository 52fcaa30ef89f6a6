"""The Python API's answers to the questions issue 60's seventh probe asked: numpy numbers
as inputs, a sweep that makes a dense preset mixture-of-experts, a plan's caveats, a serving
answer's assumptions, a plan's specs by rank."""

from __future__ import annotations

import numpy as np
import pytest

import costmodel as cm


def test_numpy_integers_give_the_numbers_python_integers_give():
    """The probe: ``batch=np.int64(2048)`` of Llama-3-405B at 8,192 tokens wrapped the step's
    FLOPs past 2^63 (MFU 2.8 % for 21.4 %); np.int32 lengths gave a serving TTFT of 3.85 s
    for 5.06 s and a negative prefill communication time. Specs hold Python numbers."""
    kw = dict(hardware="h100-sxm", gpus=16384, tp=8, pp=16, framework="megatron",
              sequence_parallel=True, recompute="full")  # fmt: skip
    plain = cm.estimate("llama3-405b", seq=8192, batch=2048, **kw)
    typed = cm.estimate("llama3-405b", seq=np.int32(8192), batch=np.int64(2048), **kw)
    assert typed["flops.step"] == plain["flops.step"] > 2**63
    assert typed["mfu"] == plain["mfu"] and type(typed.train.batch) is int
    serve = dict(hardware="h100-sxm", tp=4, output=500)
    assert (
        cm.serve("llama3-70b", input=np.int32(2000), batch=np.int32(32), **serve)["time_s.ttft"]
        == cm.serve("llama3-70b", input=2000, batch=32, **serve)["time_s.ttft"]
    )


def test_a_sweep_that_makes_a_dense_preset_mixture_of_experts_derives_its_expert_width():
    """The probe: ``n_experts=[0, 8]`` over Llama-3-8B gave NaN in every quantity and "does
    not fit" for 8 experts (the dense preset leaves d_ff_expert unset); estimate derived it."""
    grid = cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, framework="fsdp2",
                    seq=4096, n_experts=[0, 8], experts_per_token=[0, 2])  # fmt: skip
    moe = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, framework="fsdp2",
                      seq=4096, n_experts=8, experts_per_token=2)  # fmt: skip
    assert grid["params.total"][1] == moe["params.total"]
    assert grid["time_s.step"][1] == pytest.approx(moe["time_s.step"], rel=1e-12)


def test_the_python_plan_carries_the_clis_caveats():
    """The probe: ``plan --json`` cautioned the MoE error and the batch range's missing
    critical-batch limit; the Python Plan said neither."""
    moe = cm.plan("mixtral-8x7b", hardware="h100-sxm", gpus=32, batch=128, seq=4096)  # fmt: skip
    assert moe.caveats and moe.caveats[0].startswith("mixture-of-experts steps are less")
    assert f"caveat: {moe.caveats[0]}" in repr(moe) and "caveat: " in moe._repr_html_()
    ranged = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=(32, 64), seq=8192)
    assert any(c.startswith("the global batch was searched from 48 to 64") for c in ranged.caveats)


def test_a_serving_answer_says_its_limit_and_assumptions_as_the_cli_does(capsys):
    """The probe: the Python answer said neither what limits it nor its defaults (output
    128 tokens, one request, vLLM V1), had no to_dict, and under continuous batching gave
    the static batch's prefill of every prompt at once (5.06 s) that the CLI withholds."""
    from costmodel.cli import main

    ans = cm.serve("llama3-70b", tp=4, input=2000)
    assert ans.limited_by().startswith("decode: the matmuls, memory-bound")
    said = ans.assumptions()
    assert said.startswith("128 generated tokens (default; output), one request at a time "
                           "(default; batch), engine vLLM V1")  # fmt: skip
    assert "--" not in said and f"assumptions: {said}" in repr(ans)
    argv = ["serve", "--model", "llama3-70b", "--hardware", "h100-sxm", "--tp", "4",
            "--engine", "vllm", "--input", "2000", "--output", "500", "--concurrency", "32",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    import json

    cli = json.loads(capsys.readouterr().out)
    loaded = cm.serve("llama3-70b", hardware="h100-sxm", tp=4, engine="vllm", input=2000,
                      output=500, concurrency=32)  # fmt: skip
    mine = loaded.to_dict()
    assert mine["time_s"] == cli["time_s"] and mine["spec"] == cli["spec"]
    assert mine["verdict"]["limited_by"] == cli["verdict"]["limited_by"]
    assert "time_s.prefill.total" not in loaded and "prefill" not in mine["time_s"]
    with pytest.raises(KeyError, match="continuous batching does not run"):
        loaded["time_s.prefill.total"]


def test_misused_calls_are_one_error_naming_the_argument():
    """The probe: parallel_spec(-1) returned the last candidate and 10**9 an IndexError; an
    int as the hardware or a str as the parallel spec an AttributeError deep inside;
    table(None) a TypeError; a Hardware where a name is taken a 3 kB repr; the budget
    named 'budget' for budget_gb; a misspelt column a bare KeyError; a framework given
    twice ranked every layout twice."""
    p = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=1024)
    for i in (-1, 10**9):
        with pytest.raises(cm.SpecError) as err:
            p.parallel_spec(i)
        assert err.value.field == "i"
    assert p.parallel_spec(int(p.order[0])) == cm.plan(
        "llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=1024,
        frameworks=["fsdp2", "megatron", "fsdp2"]).parallel_spec(int(p.order[0]))  # fmt: skip
    twice = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=1024,
                    frameworks=["fsdp2", "fsdp2"])  # fmt: skip
    once = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=1024,
                   frameworks=["fsdp2"])  # fmt: skip
    assert twice.valid == once.valid
    model, train = cm.get_model("llama3-8b"), cm.TrainSpec(batch=8, seq=1024)
    with pytest.raises(cm.SpecError, match="got a value of type int") as err:
        cm.estimate(model, train, cm.ParallelSpec(fsdp=8), 5)
    assert err.value.field == "hardware"
    with pytest.raises(cm.SpecError, match="parallel must be a ParallelSpec") as err:
        cm.estimate(model, train, "fsdp", "h100-sxm")
    with pytest.raises(cm.SpecError, match="table takes a sweep's result or a plan"):
        cm.table(None)
    hw = cm.get_hardware("h100-sxm")  # a Hardware is taken wherever a name is (round eight)
    assert cm.max_seq("llama3-8b", hardware=hw, gpus=8, fsdp=8) == cm.max_seq(
        "llama3-8b", hardware="h100-sxm", gpus=8, fsdp=8)  # fmt: skip
    assert cm.estimate("llama3-8b", hardware=hw, gpus=8)["time_s.step"] == cm.estimate(
        "llama3-8b", hardware="h100-sxm", gpus=8)["time_s.step"]  # fmt: skip
    with pytest.raises(cm.SpecError) as err:
        cm.max_seq("llama3-8b", hardware="h100-sxm", gpus=8, budget_gb=1e6)
    assert err.value.field == "budget_gb" and str(err.value).startswith("budget_gb must be")
    grid = cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, framework="fsdp2",
                    seq=[1024, 2048])  # fmt: skip
    with pytest.raises(KeyError, match=r"did you mean 'time_s\.step'"):
        grid["time_s.stepp"]
