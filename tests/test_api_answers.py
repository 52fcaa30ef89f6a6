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
    base = dict(hardware="h100-sxm", gpus=8, batch=64, seq=512)
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
    p = cm.plan(
        "cs336-small",
        hardware=cm.get_hardware("h100-sxm"),
        max_gpus=4,
        batch=16,
        seq=512,
        objective="cost",
        frameworks=["fsdp2"],
        recompute=["none"],
    )
    assert sorted(set(p["gpus"].tolist())) == [1, 2, 3, 4]
    assert "on up to 4 x h100-sxm" in repr(p) and "ranked by cost" in repr(p)


def test_a_plan_where_nothing_fits_says_why_as_the_cli_does(capsys):
    """Issue 60's probes: the API's plan said only "no layout fits", then "try more GPUs"
    with no count; the CLI gives the smallest peak and the nearest layout that fits, and
    so does the Plan now (``Plan.nearest``, in the API's names), the same row."""
    p = cm.plan("cs336-2.7b", hardware="a100-40gb", gpus=1, batch=4, seq=1024,
                frameworks=["fsdp2"], recompute=["none", "full"])  # fmt: skip
    text = repr(p)
    assert len(p) == 0 and "no layout fits: the smallest peak is" in text
    assert "GiB per device" in text and "--" not in text
    assert p.nearest_searched and p.nearest["gpus"] == 2
    assert "nearest that fits: 2 GPUs (2x): fsdp2 dp1 fsdp1 tp2+sp" in text
    assert main(["plan", "--model", "cs336-2.7b", "--hardware", "a100-40gb", "--gpus", "1",
                 "--global-batch", "4", "--seq", "1024", "--frameworks", "fsdp2",
                 "--recompute", "none,full", "--json"]) == 1  # fmt: skip
    cli = json.loads(capsys.readouterr().out)["nearest_fit"]
    assert cli["time_s.step"] == p.nearest["time_s.step"] and cli["changes"] == p.nearest["changes"]


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


def test_a_sequence_length_not_given_is_said_with_the_models_own(capsys):
    """Issue 60's third probe: a missing seq silently became 1,024 for a model trained at
    8,192 (24.5 GiB "fits" where the run's length is TIGHT at 70.9 GiB): now a note, in the
    API and the CLI alike; a seq given says nothing."""
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, framework="fsdp2")
    said = "seq 1,024 tokens, the default (the model takes up to 8,192): set seq to change"
    assert est.notes[0] == said and said in repr(est)
    assert main(["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
                 "--batch", "64", "--framework", "fsdp2"]) == 0  # fmt: skip
    assert said.replace("set seq", "set --seq") in capsys.readouterr().out
    given = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=1024)
    assert not any(n.startswith("seq ") for n in given.notes)


def test_to_dict_of_a_layout_that_does_not_fit_is_the_clis_json(capsys):
    """The API's to_dict gave MFU 0.47 where the CLI's --json gives null, and lacked the
    memory table's transients: one method now serves both."""
    kw = dict(hardware="h100-sxm", gpus=8, batch=64, seq=16384, framework="fsdp2")
    est = cm.estimate("llama3-8b", **kw)
    assert not est.fit().fits and est["mfu"] > 0  # the formula's number stays, by key
    ours = json.loads(est.to_json())
    assert (
        main(
            [
                "estimate",
                "--model",
                "llama3-8b",
                "--hardware",
                "h100-sxm",
                "--gpus",
                "8",
                "--batch",
                "64",
                "--seq",
                "16384",
                "--framework",
                "fsdp2",
                "--json",
            ]
        )
        == 0
    )
    cli = json.loads(capsys.readouterr().out)
    assert ours["mfu"] is None and cli["mfu"] is None and ours["hfu"] is None
    assert ours["time_s"]["step"] == cli["time_s"]["step"] > 0  # what it would take, as --full
    assert ours["memory_bytes_per_device"] == cli["memory_bytes_per_device"]
    parts = ours["memory_bytes_per_device"]
    listed = sum(parts[k] for k in ("params", "master", "grads", "optimizer", "buffers",
                                    "activations", "frozen", "transients"))  # fmt: skip
    assert listed == pytest.approx(parts["peak"], rel=1e-12)


def test_the_specs_path_says_what_the_keyword_path_says():
    """Specs gave no caveats (the keyword path did) and took hardware without a layout
    silently (a one-device number with no verdict)."""
    from costmodel import ParallelSpec, TrainSpec, get_hardware, get_model

    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    train = TrainSpec(batch=64, seq=16384, grad_accum=8)
    est = cm.estimate(model, train, ParallelSpec(fsdp=8, framework="fsdp2"), hw)
    assert est.caveats and est.caveats == tuple(cm.verdict(est)["caveats"])
    with pytest.raises(cm.SpecError, match="hardware prices a layout: give a ParallelSpec"):
        cm.estimate(model, TrainSpec(batch=8, seq=1024), hardware="h100-sxm")


def test_the_results_are_mappings_and_wrong_arguments_name_themselves():
    """``est.values()`` and ``plan.values()`` raised "'dict' object is not callable";
    evaluating a bare symbol, verdict of a dict, from_hf of a list and a row past the
    candidates raised Python's internals."""
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=1024)
    assert list(est.values()) == [est[k] for k in est]
    assert est.evaluate(cm.symbol("T")) == 1024
    p = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=(24, 64), seq=4096)
    assert [list(v) for v in p.values()][:2] == [list(p["gpus"]), list(p["batch"])]
    assert set(p.columns["batch"].tolist()) <= set(range(24, 65)) and p.top(1)[0]["batch"] == 64
    for call, words in ((lambda: cm.verdict({}), "verdict takes an Estimate"),
                        (lambda: cm.from_hf([1, 2]), "from_hf takes a config.json's path"),
                        (lambda: p.row(10**9), "row i must be below the"),
                        (lambda: cm.plan("llama3-8b", hardware="h100-sxm", gpus=8,
                                         batch="32:64"), "not text"),
                        (lambda: cm.sweep("llama3-8b", hardware="h100-sxm", gpus=[8, 3],
                                          batch=64), "gpus 3 leave 3 data-parallel ranks"),
                        (lambda: cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64,
                                          microbatch=3), "microbatch \\* dp \\* fsdp"),
                        (lambda: cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64,
                                          quantities=["time_s.stpe"]), "did you mean"),
                        (lambda: cm.serve("llama3-8b", context=4096)["tpot"],
                         "did you mean 'time_s.tpot'")):  # fmt: skip
        with pytest.raises((cm.SpecError, KeyError), match=words):
            call()
