"""The notebook surface (costmodel.api): names and units as the CLI's, results that display
short and read like dicts, tables with their inputs, ``.subs`` with the public value map,
the package's symbols, field docs in ``help()`` (issue 35, item 7)."""

from __future__ import annotations

import builtins
import json
import pydoc
import subprocess
import sys

import numpy as np
import pytest
import sympy as sp

import costmodel as cm
from costmodel.api import as_fields
from costmodel.cli import main
from costmodel.inputs import build
from costmodel.symbols import SYMBOLS, T, subs_safe, symbol

H100 = {"hardware": "h100-sxm", "gpus": 8, "seq": 8192, "batch": 64, "framework": "fsdp2"}


@pytest.fixture(scope="module")
def est8():
    return cm.estimate("llama3-8b", **H100)


def test_estimate_by_name_is_the_clis_setup(est8):
    """The issue's call works and is exactly inputs.build's (the CLI's and the app's)."""
    setup = build({"model": "llama3-8b", **H100})
    assert est8.values == setup.estimate().values
    assert est8.parallel == setup.parallel and est8.parallel.fsdp == 8  # fsdp2 shards
    assert est8.train.grad_accum == 8  # micro-batch 1, as the CLI
    assert est8.notes == tuple(as_fields(n) for n in setup.notes)  # keywords, not flags
    assert any("micro-batch 1" in n for n in est8.notes)
    assert not any("--" in n for n in est8.notes)


def test_estimate_with_specs_still_works():
    model, train = cm.get_model("cs336-small"), cm.TrainSpec(batch=4, seq=256)
    by_spec = cm.estimate(model, train)
    by_name = cm.estimate("cs336-small", batch=4, seq=256, grad_accum=1)
    assert by_spec.values == by_name.values
    with_hw = cm.estimate(model, train, cm.ParallelSpec(dp=2), "h100-sxm")
    assert with_hw.hardware.name == cm.get_hardware("h100-sxm").name


def test_estimate_by_spec_object_with_overrides():
    spec = cm.get_model("cs336-small").replace(n_layers=6)
    est = cm.estimate(spec, batch=4, seq=256)
    assert est.model.n_layers == 6 and est.train.seq == 256


@pytest.mark.parametrize(
    ("inputs", "field"),
    [
        ({"micro_batch": 2}, "micro_batch"),  # the CLI's name is microbatch
        ({"budget_bytes": 80}, "budget_bytes"),
        ({"tensor_parallel": 2}, "tensor_parallel"),
    ],
)
def test_wrong_names_are_refused_naming_the_field(inputs, field):
    with pytest.raises(cm.SpecError) as err:
        cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, **inputs)
    assert err.value.field == field


def test_plan_given_the_clis_global_batch_names_batch():
    """Issue 60: ``plan(global_batch=64)`` (the CLI's --global-batch) raised Python's
    "missing 1 required keyword-only argument: 'batch'"; it is one SpecError naming the
    API's name, and a plan without a batch names the field it needs."""
    with pytest.raises(cm.SpecError, match="the Python name is batch") as err:
        cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, global_batch=64)
    assert err.value.field == "global_batch"
    with pytest.raises(cm.SpecError, match="plan needs batch") as err:
        cm.plan("llama3-8b", hardware="h100-sxm", gpus=8)
    assert err.value.field == "batch"


def test_estimate_is_dict_like(est8):
    assert "time_s.step" in est8 and "no such" not in est8
    assert list(est8.keys()) == list(est8.values) and len(est8) == len(est8.values)
    assert dict(est8.items())["mfu"] == est8["mfu"] and est8.get("no such", 3) == 3


def test_estimate_repr_is_short_and_says_the_verdict(est8):
    text = repr(est8)
    assert len(text) < 1500 and len(text.splitlines()) <= 12
    assert est8.fit().sentence() in text  # the one fit rule's words
    assert "fsdp 8" in text and "llama3-8b" in text and "GiB per device" in text
    if est8.fit().fits:
        assert f"{est8['mfu']:.1%}" in text
    page = est8._repr_html_()
    assert page.startswith("<table>") and "llama3-8b" in page and len(page) < 3000


def test_a_layout_that_does_not_fit_shows_no_mfu():
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=1, seq=8192, batch=4)
    assert not est.fit().fits
    assert "does not fit" in repr(est) and "MFU" not in repr(est)


def test_subs_with_the_public_value_map_gives_a_matmuls_time(est8):
    """``.subs`` used to end in ``nan is not comparable``: sympy's Max, given some symbols
    but not all, dropped an argument (Max(1, floor(132/ceiling(a/b)))). A matmul's time
    holds that wave rule (the step time holds it too, but takes a minute to substitute)."""
    expr = est8.expr("roofline.attn_q.time_s")
    values = est8.symbol_values()
    assert expr.free_symbols <= set(values) and expr.atoms(sp.floor)
    assert float(expr.subs(values)) == pytest.approx(est8["roofline.attn_q.time_s"], rel=1e-12)


def test_subs_safe_max_waits_for_numbers():
    n, a, b = sp.symbols("n a b", positive=True, integer=True)
    plain = sp.Max(1, sp.floor(n / sp.ceiling(a / b)), evaluate=False)
    assert plain.subs(n, 132).subs({a: 1000, b: 1}) == 0  # sympy's: the 1 was dropped
    safe = subs_safe(plain)
    assert safe.subs(n, 132).subs({a: 1000, b: 1}) == 1 and safe.subs({n: 132, a: 10, b: 1}) == 13
    assert str(safe) == str(plain) and sp.latex(safe) == sp.latex(plain)
    assert sp.lambdify([n, a, b], safe)(132, 1000, 1) == 1


def test_the_package_symbols_and_the_assumption_trap():
    flops = cm.estimate("cs336-small", batch=4, seq=256).expr("flops.forward")
    assert sp.diff(flops, sp.Symbol("T")) == 0  # another symbol: no assumptions
    assert sp.diff(flops, symbol("T")) != 0 and symbol("T") is T is cm.symbol("T")
    assert SYMBOLS["alpha_X"].is_positive and "T" in cm.symbols.__doc__
    with pytest.raises(KeyError, match="unknown symbol 'Q'"):
        symbol("Q")


def test_sweep_takes_gpus_and_keeps_its_inputs():
    seqs = [2048, 4096]
    out = cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=seqs,
                   framework="fsdp2", microbatch=1, quantities=["time_s.step"])  # fmt: skip
    assert list(out["seq"]) == seqs and list(out["gpus"]) == [8, 8]
    assert list(out["fsdp"]) == [8, 8] and list(out["dp"]) == [1, 1]  # as the CLI's gpus
    one = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=4096,
                      framework="fsdp2")  # fmt: skip
    assert out["time_s.step"][1] == pytest.approx(one["time_s.step"], rel=1e-9)
    frame = out.frame()
    assert list(frame["seq"]) == seqs and "time_s.step" in frame.columns


def test_sweep_gpus_fill_dp_under_a_framework_that_replicates():
    out = cm.sweep("cs336-small", hardware="h100-sxm", gpus=[4, 8], tp=2, batch=8,
                   framework="megatron", quantities=["time_s.step"])  # fmt: skip
    assert list(out["dp"]) == [2, 4] and list(out["fsdp"]) == [1, 1]
    with pytest.raises(cm.SpecError) as err:
        cm.sweep("cs336-small", hardware="h100-sxm", gpus=6, tp=4)
    assert err.value.field == "gpus"


def test_tables_without_pandas(monkeypatch):
    out = cm.sweep("cs336-small", batch=4, seq=[128, 256], quantities=["memory_bytes.peak"])
    real = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("no pandas")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    cols = cm.table(out)
    assert isinstance(cols, dict) and list(cols["seq"]) == [128, 256]
    assert cols["memory_bytes.peak"].shape == (2,)
    with pytest.raises(ImportError, match="pandas"):
        out.frame()


@pytest.fixture(scope="module")
def plan8():
    return cm.plan("cs336-small", hardware="h100-sxm", gpus=8, batch=16, seq=512,
                   frameworks=["fsdp2"], recompute=["none"])  # fmt: skip


def test_plan_by_name_is_the_engines(plan8):
    assert plan8.model.name == "cs336-small" and plan8.gpus == 8 and len(plan8) > 0
    best = plan8.top(1)[0]
    assert plan8["time_s.step"][0] == best["time_s.step"]
    assert "mfu" in plan8 and "nothing" not in plan8 and dict(plan8.items())["tp"][0] == best["tp"]


def test_plan_table_and_display(plan8):
    tab = plan8.table()
    assert list(tab["rank"][:3]) == [1, 2, 3] and len(tab["rank"]) == len(plan8)
    assert tab["label"][0] in repr(plan8) and len(repr(plan8).splitlines()) <= 9
    assert "ranked by time" in repr(plan8) and "ranked by time" in plan8._repr_html_()
    frame = cm.table(plan8)
    assert frame["time_s.step"].iloc[0] == plan8.top(1)[0]["time_s.step"]
    assert "<ol" in plan8._repr_html_()


def test_inverse_questions_by_name_and_units():
    name = {"hardware": "h100-sxm", "gpus": 8, "framework": "fsdp2"}
    seq = cm.max_seq("llama3-8b", batch=8, **name)
    at = cm.estimate("llama3-8b", batch=8, seq=seq["seq"], **name)
    assert at.fit().fits and seq["budget_bytes"] == at.fit().budget_bytes
    gb = cm.solve("max-batch", "cs336-small", seq=1024, budget_gb=20, **name)
    assert gb["budget_bytes"] == 20e9 and gb["batch"] > 0
    fsdp = cm.min_fsdp("llama3-8b", hardware="h100-sxm", framework="fsdp2", seq=8192)
    assert fsdp["fsdp"] is not None and fsdp["per_device_bytes"] <= fsdp["budget_bytes"]


def test_a_budget_in_bytes_is_refused_naming_the_field():
    with pytest.raises(cm.SpecError) as err:
        cm.min_fsdp("llama3-8b", hardware="h100-sxm", budget_gb=80e9)
    assert err.value.field == "budget_gb" and "not bytes" in str(err.value)


def test_hf_import_is_top_level(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 256,
           "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 512}  # fmt: skip
    spec = cm.from_hf(cfg)
    assert (spec.d_model, spec.n_layers, spec.n_kv_heads) == (256, 2, 2)
    assert cm.estimate(spec, batch=2, seq=128)["params.total"] > 0


@pytest.mark.parametrize("cls", [cm.ModelSpec, cm.TrainSpec, cm.ParallelSpec])
def test_help_shows_field_docs(cls):
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    assert "Fields" in text
    first = next(iter(cls.__dataclass_fields__))
    assert f"{first}: " in text


def test_help_shows_a_fields_own_words():
    text = pydoc.render_doc(cm.TrainSpec, renderer=pydoc.plaintext)
    assert "Tokens per sequence T." in text


def test_grid_shapes_are_kept_for_existing_callers():
    out = cm.sweep("cs336-small", batch=np.array([[2], [4]]), seq=[128, 256],
                   quantities=["memory_bytes.peak"])  # fmt: skip
    assert out["memory_bytes.peak"].shape == (2, 2) and out["batch"].shape == (2, 2)


def test_sweep_with_gpus_takes_the_clis_micro_batch(est8):
    """gpus alone: one sequence per device per micro-batch, as estimate (the CLI) takes it."""
    out = cm.sweep("llama3-8b", quantities=["time_s.step"], **H100)
    assert out["microbatch"].item() == 1
    assert out["time_s.step"].item() == pytest.approx(est8["time_s.step"], rel=1e-9)
    with pytest.raises(cm.SpecError) as err:
        cm.sweep("llama3-8b", gpus=8)
    assert err.value.field == "hardware"


def test_sweep_with_gpus_keeps_the_engines_micro_batch():
    """Issue 60 (micro_batch vs microbatch): with gpus, ``sweep(micro_batch=2)`` priced one
    sequence a device (gpus' default overwrote it) while its table said micro_batch 2;
    the engine's name now means what the CLI's does, and both at once are refused."""
    ask = {"hardware": "h100-sxm", "gpus": 8, "batch": 64, "seq": [1024, 2048]}
    engine = cm.sweep("llama3-8b", micro_batch=2, **ask)
    cli = cm.sweep("llama3-8b", microbatch=2, **ask)
    for key in ("time_s.step", "memory_bytes_per_device.peak"):
        assert np.array_equal(engine[key], cli[key])
    with pytest.raises(cm.SpecError, match="not both") as err:
        cm.sweep("llama3-8b", micro_batch=2, microbatch=2, **ask)
    assert err.value.field == "micro_batch"


def test_an_inverse_with_no_answer_says_why():
    """The default framework replicates (dp 8): 8B's state alone passes 72 GiB per device."""
    out = cm.max_seq("llama3-8b", hardware="h100-sxm", gpus=8, batch=8)
    assert out["seq"] is None and "does not fit: peak" in out["reason"]
    tiny = cm.min_fsdp("llama3-8b", hardware="h100-sxm", seq=8192, budget_gib=1)
    assert tiny["fsdp"] is None and tiny["reason"].startswith("no fsdp degree up to")
    some = cm.min_fsdp("llama3-8b", hardware="h100-sxm", seq=2048, budget_gib=40)
    assert (some["fsdp"], some["fsdp_usable"]) == (5, 8)  # 5 fits; 8 is the degree to run


def test_plan_takes_one_framework_by_estimates_name():
    """Issue 60's probe: ``plan(..., framework="fsdp2")`` said "hardware is required with
    framework" though hardware was given (plan takes ``frameworks``)."""
    p = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=4096,
                       framework="fsdp2")  # fmt: skip
    assert set(p.table(5)["framework"]) == {"fsdp2"}


def test_notebook_answers_say_what_the_cli_says():
    """Issue 60's probe: a sweep of a few quantities had no ``fits`` column (step times of
    layouts 3x over the budget read as real), ``sweep(seq=[])`` was an IndexError, a Table
    printed as a dict of arrays, and ``max_seq`` gave a length past the model's positions
    without the CLI's note or what it held fixed."""
    table = cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64,
                            framework="fsdp2", seq=[8192, 32768],
                            quantities=["time_s.step"])  # fmt: skip
    assert list(table["fits"]) == [True, False]
    assert list(table["tight"]) == [True, False]  # reserved 85.1 GiB of 80 (estimate: TIGHT)
    assert "memory_bytes_per_device.peak" not in table  # asked for the step only
    assert repr(table).startswith("Table of 2 rows x 10 columns\n")
    assert "time_s.step" in repr(table).splitlines()[1]
    with pytest.raises(cm.SpecError, match="seq is an empty list"):
        cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, seq=[])
    longest = cm.max_seq("llama3-8b", hardware="h100-sxm", gpus=8, fsdp=8, batch=8)
    assert longest["seq"] > 8192 and "past llama3-8b's 8,192 trained positions" in longest["note"]
    assert longest["assumed"].startswith("batch 8, micro-batch 1 per device x grad-accum 1")
    with pytest.raises(cm.SpecError, match="budget_gb is in GB, not bytes"):
        cm.max_batch("llama3-8b", hardware="h100-sxm", budget_gb=1e308)


def test_a_device_quantity_without_a_device_says_it_needs_one():
    """A probe: estimate("gpt2")["time_s.step"] said unknown quantity 'time_s.step' and
    suggested time_s.step; a price without a token budget was dropped without a word."""
    with pytest.raises(KeyError, match=r"'time_s\.step' needs a device"):
        cm.estimate("gpt2")["time_s.step"]
    # issue 60's probe: a misspelt one was told it needs a device, then, with hardware, that
    # it is unknown; it now hears both at once
    with pytest.raises(KeyError, match=r"did you mean 'time_s\.step'.*a device's: give hardware"):
        cm.estimate("gpt2")["time_s.stepp"]
    with pytest.raises(KeyError, match="unknown quantity 'nope'"):
        cm.estimate("gpt2")["nope"]
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, price_per_hour=2.5)
    assert any("give token_budget for the days and the cost" in n for n in est.notes)


def test_the_device_roots_are_what_a_layout_adds():
    """``DEVICE_ROOTS`` (what "needs a device" is said of) is what a layout on a device adds
    to an estimate's quantities, with the token budget's."""
    from costmodel.engine.quantities import DEVICE_ROOTS

    bare = {k.split(".")[0] for k in cm.estimate("gpt2").values}
    placed = cm.estimate("gpt2", hardware="h100-sxm", token_budget=1e9, price_per_hour=2.0)
    assert {k.split(".")[0] for k in placed.values} - bare == DEVICE_ROOTS


def test_solved_answers_carry_the_verdict_solve_prints(capsys):
    """``max_seq``, ``max_batch`` and ``min_fsdp`` return the verdict ``solve`` prints at
    their answer, TIGHT included (a probe: the API's max_seq answer had no verdict where
    the CLI said "fits, but TIGHT")."""
    ask = {"hardware": "h100-sxm", "gpus": 8, "batch": 8, "framework": "fsdp2"}
    seq = cm.max_seq("llama3-8b", **ask)
    assert seq["verdict"]["fits"] and seq["verdict"]["memory"]["tight"]
    assert seq["verdict"]["summary"].startswith("fits, but TIGHT")
    del ask["batch"]  # what max-batch solves for (refused as an input, as the CLI does)
    batch = cm.max_batch("llama3-8b", **{**ask, "seq": 4096})
    flags = [f"--{k}={v}" for k, v in {**ask, "seq": 4096}.items()]
    assert main(["solve", "max-batch", "--model", "llama3-8b", *flags, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["batch"] == batch["batch"] and said["verdict"] == batch["verdict"]
    fsdp = cm.min_fsdp("llama3-8b", hardware="h100-sxm", seq=8192, recompute="full")
    assert fsdp["fsdp"] == 3 and fsdp["verdict"]["fits"]


def test_min_fsdp_says_what_it_held_as_max_batch_does():
    """Issue 60: ``min_fsdp`` returned less than the CLI (no ``assumed``, where max_batch
    has one). A fifth probe: ``batch=8`` was one sequence a device x grad-accum 8, so its
    verdict at fsdp 8 priced a step of 64 sequences, where the CLI refuses --batch. Now
    ``batch`` is refused as the CLI does, and ``batch_tokens`` (the CLI's --batch-tokens)
    holds that many tokens a device in one micro-batch."""
    with pytest.raises(cm.SpecError, match="leave batch out") as err:
        cm.min_fsdp("llama3-8b", hardware="h100-sxm", framework="fsdp2", seq=8192, batch=8)
    assert err.value.field == "batch"
    fsdp = cm.min_fsdp("llama3-8b", hardware="h100-sxm", framework="fsdp2", seq=4096,
                       batch_tokens=8192)  # fmt: skip
    held = "micro-batch 2 x seq 4096 per device x grad-accum 1 (the batch grows with the degree)"
    assert fsdp["assumed"].startswith(f"{held}, framework fsdp2")
    assert "fsdp 1" not in fsdp["assumed"] and "grad-accum 1" in fsdp["verdict"]["assumptions"]
    none = cm.min_fsdp("xxl", hardware="tpu-v5p", seq=8192, budget_gb=95)
    assert none["fsdp"] is None and none["assumed"].startswith("micro-batch 1 x seq 8192")


def test_a_wide_sweep_shows_the_inputs_it_varies_and_which_rows_are_tight():
    """A probe: a sweep over seq printed six columns of 155, seq not among them, and a
    TIGHT row (estimate's verdict) as a plain ``fits True``."""
    table = cm.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64,
                     seq=[2048, 4096, 8192], framework="fsdp2")  # fmt: skip
    head = repr(table).splitlines()[1].split()
    assert head[0] == "seq" and "batch" not in head and head[-2:] == ["fits", "tight"]
    assert list(table["tight"]) == [False, False, True]
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=8192,
                      framework="fsdp2")  # fmt: skip
    assert est.fit().tight


def test_importing_the_package_loads_no_model_and_names_every_public_name():
    """``import costmodel`` imports nothing beyond the package (each public name on first
    use): a distributed rank importing ``costmodel.specs`` does not pay for sympy; every
    name of ``__all__`` resolves, and ``__all__`` is every name the package maps."""
    code = ("import sys, costmodel; print(sorted(m for m in ('sympy', 'numpy', "
            "'costmodel.api') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
    assert set(cm.__all__) == set(cm._MODULE_OF)
    assert all(getattr(cm, name) is not None for name in cm.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cm.nope  # noqa: B018
