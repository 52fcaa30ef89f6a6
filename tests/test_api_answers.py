"""The Python API says what the CLI says (issue 60's third probe): ``plan``'s search options
and refusals, a plan's ranking and why nothing fits, an estimate's caveats and verdict, the
questions that refuse what they would drop, serve's names, a fine-tuning run's repr."""

from __future__ import annotations

import json

import pytest

import costmodel as cm
from costmodel.api import as_fields
from costmodel.cli import main


def test_plan_refuses_what_it_searches_and_takes_the_clis_search_options():
    """Issue 60's probe: ``plan(tp=2)`` said "hardware is required with tp" though hardware
    was given; ``max_gpus``, ``objective`` and ``ep_dispatchers`` (the CLI's) were unknown
    inputs, a Hardware object was refused with its whole repr, and two kinds in one string
    were taken as one name."""
    base = dict(hardware="h100-sxm", gpus=8, batch=64, seq=512, progress=False)
    cases = (({"tp": 2}, "tp", "plan searches tp: drop it"),
             ({"microbatch": 2}, "microbatch", "microbatches lists"),
             ({"token_budget": 1e9}, "token_budget", "does not size a run"),
             ({"micro_batches": [1]}, "micro_batches", "is microbatches"),
             ({"hardware": "h100-sxm,b200"}, "hardware", "one device kind"),
             ({"max_gpus": 8}, "gpus", r"gpus \(one count\) or max_gpus"))  # fmt: skip
    for given, field, words in cases:
        with pytest.raises(cm.SpecError, match=words) as err:
            cm.plan("cs336-small", **{**base, **given})
        assert err.value.field == field
    p = cm.plan("cs336-small", hardware=cm.get_hardware("h100-sxm"), max_gpus=4, batch=16,
                seq=512, objective="cost", frameworks=["fsdp2"], recompute=["none"],
                progress=False)  # fmt: skip
    assert sorted(set(p["gpus"].tolist())) == [1, 2, 3, 4]
    assert "on up to 4 x h100-sxm" in repr(p) and "ranked by cost" in repr(p)


def test_a_plan_where_nothing_fits_says_why_as_the_cli_does():
    """Issue 60's probe: the API's plan said only "no layout fits"; the CLI gives the
    smallest peak and what to try, and so does the Plan now, in the API's names."""
    p = cm.plan("cs336-2.7b", hardware="a100-40gb", gpus=1, batch=4, seq=1024,
                frameworks=["fsdp2"], recompute=["none", "full"], progress=False)  # fmt: skip
    text = repr(p)
    assert len(p) == 0 and "no layout fits: the smallest peak is" in text
    assert "GiB per device" in text and "try more GPUs" in text and "--" not in text


def test_an_estimate_carries_the_clis_caveats_and_verdict(capsys):
    """Issue 60's probe: the Estimate dropped the CLI's caveats, "limited by" and nearest
    fit, and ``estimate(memory_headroom=...)`` was an unknown input though the CLI takes it.
    ``costmodel.verdict(est)`` is the CLI's ``--json`` verdict, in the API's names."""
    name = dict(hardware="b200", gpus=16, ep=16, seq=4096, batch=64, framework="fsdp2")
    est = cm.estimate("deepseek-v2-lite", **name)
    assert main(["estimate", "--model", "deepseek-v2-lite", "--hardware", "b200", "--gpus", "16",
                 "--ep", "16", "--seq", "4096", "--batch", "64", "--framework", "fsdp2",
                 "--json"]) == 0  # fmt: skip
    cli = json.loads(capsys.readouterr().out)["verdict"]
    said = cm.verdict(est)
    assert said["caveats"] == cli["caveats"] == list(est.caveats)
    assert said["limited_by"] == cli["limited_by"]
    assert said["assumptions"] == as_fields(cli["assumptions"])  # ep_dispatcher, not --ep-...
    assert "caveat 2: mixture-of-experts" in repr(est)
    tight = cm.estimate("cs336-2.7b", hardware="a100-40gb", gpus=1, seq=1024, batch=4,
                        memory_headroom=0.85)  # fmt: skip
    assert tight.fit().budget_bytes == 0.85 * tight.hardware.hbm_bytes
    near = cm.verdict(tight)["nearest_fit"]
    assert not tight.fit().fits and near["inputs"]["gpus"] >= 2 and "--" not in near["change"]
    with pytest.raises(cm.SpecError, match="memory_headroom needs hardware"):
        cm.estimate("llama3-8b", memory_headroom=0.8)


def test_questions_refuse_inputs_they_would_drop_silently():
    """Issue 60's probe: ``max_batch(microbatch=2)`` and ``max_seq(seq=2048)`` dropped the
    input silently where the CLI refuses it ("drop --microbatch"), and ``sweep`` without a
    model answered for cs336-2.7b."""
    name = dict(hardware="h100-sxm", gpus=8, framework="fsdp2")
    with pytest.raises(cm.SpecError, match="max-batch solves for the batch: drop microbatch"):
        cm.max_batch("llama3-8b", seq=8192, microbatch=2, **name)
    with pytest.raises(cm.SpecError, match="max-seq solves for the seq: drop seq") as err:
        cm.max_seq("llama3-8b", batch=8, seq=2048, **name)
    assert err.value.field == "seq"
    with pytest.raises(cm.SpecError, match="sweep needs a model") as err:  # no cs336-2.7b default
        cm.sweep(hardware="h100-sxm", gpus=8, batch=64, seq=[1024, 2048])
    assert err.value.field == "model"


def test_serve_speaks_the_apis_names():
    """Issue 60's probe: ``serve`` said "--tp 4 fits the batch of 32" and "give --context"
    inside Python, where estimate's notes name keywords."""
    ans = cm.serve("llama3-70b", hardware="h100-sxm", tp=2, input=2000, output=500, batch=512)
    assert not ans.fits and ans.nearest.startswith("tp ") and "--" not in ans.nearest
    with pytest.raises(cm.SpecError, match=r"give context, or input \(and output\)"):
        cm.serve("llama3-8b", hardware="h100-sxm")


def test_a_fine_tuning_estimate_says_so_in_its_repr():
    """Issue 60's probe: an Estimate of a QLoRA run read as full training in its repr."""
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=1, finetune="qlora", seq=2048,
                      batch=4)  # fmt: skip
    assert "bf16-mixed, qlora, grad-accum" in repr(est)
