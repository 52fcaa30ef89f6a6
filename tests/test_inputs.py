"""The one spec layer and front door: the CLI and the app build the same specs from the same
inputs, with the same defaults and messages; every error names its field."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from costmodel import SpecError, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import HARDWARE, get_hardware, hardware_from_dict
from costmodel.cli import main
from costmodel.cli.args import values_of
from costmodel.inputs import BY_KEY, INPUTS, build, section_of
from costmodel.specs.model import PRECISIONS, ModelSpec
from costmodel.specs.parallel import OVERLAP_RULES, ZERO_STAGES, ParallelSpec
from explorer.state import APP_REQUIRED, APP_UNSET, START, setup_of


def test_an_unset_reduce_dtype_is_the_frameworks_own_everywhere():
    """FSDP2 reduces in fp32 unless told otherwise (torchtitan), the others in the compute
    dtype; the CLI, the specs and a framework change all follow that (issue 35)."""
    assert ParallelSpec(framework="fsdp2").grad_reduce_fp32 is True
    assert ParallelSpec(framework="megatron").grad_reduce_fp32 is False
    assert ParallelSpec(framework="fsdp2").replace(framework="deepspeed").grad_reduce_fp32 is False
    stated = ParallelSpec(framework="fsdp2", grad_reduce_fp32=False)
    assert stated.replace(framework="megatron").grad_reduce_fp32 is False
    args = {"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 8, "fsdp": 8, "batch": 8}
    assert build({**args, "framework": "fsdp2"}).parallel.grad_reduce_fp32 is True
    assert (
        build({**args, "framework": "fsdp2", "grad_reduce_fp32": False}).parallel.grad_reduce_fp32
        is False
    )


def test_schema_defaults_are_the_specs_defaults():
    for cls in (TrainSpec, ParallelSpec):  # the declared defaults: None is "unset"
        for name, field in cls.__dataclass_fields__.items():
            derived = name == "grad_accum"  # unset: from the micro-batch (inputs' doc)
            assert BY_KEY[name].default == (None if derived else field.default), name
    assert BY_KEY["precision"].choices == PRECISIONS
    assert BY_KEY["zero"].choices == ZERO_STAGES == (1, 2, 3)
    assert BY_KEY["overlap"].choices == OVERLAP_RULES
    assert all(i.section in ("model", "training", "cluster", "cost") for i in INPUTS)


def test_app_starts_from_the_schema_defaults_plus_what_the_cli_asks_for():
    differing = {k: v for k, v in START.items() if v != BY_KEY[k].default}
    assert differing == {**APP_REQUIRED, **APP_UNSET}


def _cli_values(argv: list[str]) -> dict:
    from costmodel.cli import make_parser

    return values_of(make_parser().parse_args(["estimate", *argv]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "gpt2", "--batch", "64", "--seq", "512"],
        ["--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "16", "--fsdp", "8",
         "--batch", "64", "--microbatch", "2", "--recompute", "full", "--no-sequence-parallel"],
        ["--model", "cs336-2.7b", "--hardware", "h100-sxm", "--tp", "2", "--batch", "8",
         "--token-budget", "1e9", "--price-per-hour", "2"],
    ],
)  # fmt: skip
def test_cli_and_app_build_the_same_setup(argv):
    values = _cli_values(argv)
    cli = build(values)
    app, errors = setup_of({**START, **values})
    assert errors == {}
    if cli.hardware is None:  # the app always has a device; compare what the CLI has
        assert (app.model, app.train) == (cli.model, cli.train)
    else:  # the app shows seq in its widget; the CLI notes a seq not given
        seen = tuple(n for n in cli.notes if not n.startswith("seq "))
        assert app == dataclasses.replace(cli, notes=seen)
        assert app.estimate().values == cli.estimate().values


@pytest.mark.parametrize(
    ("values", "field", "section", "message"),
    [
        ({"seq": 0}, "seq", "training", "seq must be >= 1 (got 0)"),
        ({"n_heads": 7}, "n_heads", "model", "n_heads must divide d_model"),
        ({"model": "gpt2", "seq": 4096}, "seq", "training", "seq must be <= max_positions"),
        ({"gpus": 8, "tp": 3}, "tp", "cluster", "must divide gpus"),  # the one degree set
        ({"gpus": 4, "dp": 2}, "gpus", "cluster", "must equal gpus"),
        ({"fsdp": 8, "batch": 4}, "dp", "cluster", "dp * fsdp * grad_accum must divide batch"),
        ({"microbatch": 3, "batch": 8}, "microbatch", "training", "microbatch 3 x the"),
        ({"token_budget": -1.0}, "token_budget", "cost", "token_budget must be > 0"),
        (
            {"token_budget": 1000.0, "hardware": "h100-sxm"},
            "token_budget",
            "cost",
            "less than one step's",
        ),
        ({"price_per_hour": math.nan}, "price_per_hour", "cost", "must be finite"),
        ({"precision": "fp8", "hardware": "a100-80gb"}, "precision", "training", "no fp8 peak"),
        ({"colour": 3}, "colour", "cluster", "unknown input"),
        ({"hardware": 3}, "hardware", "cluster", "hardware must be a catalog name"),
        ({"ep": 2}, "ep", "cluster", "ep > 1 needs a mixture-of-experts model"),
        (
            {"model": "mixtral-8x7b", "gpus": 8, "batch": 8, "ep": 8, "ep_overlap": True},
            "ep_overlap",
            "cluster",
            "framework=megatron",
        ),
    ],
)
def test_every_error_names_its_field_and_section(values, field, section, message):
    with pytest.raises(SpecError) as err:
        build({"model": "cs336-2.7b", "hardware": "h100-sxm", **values})
    assert err.value.field == field and section_of(field) == section
    assert message in str(err.value)


def test_cli_and_app_say_the_same_sentence(capsys):
    argv = ["estimate", "--model", "cs336-2.7b", "--hardware", "h100-sxm", "--fsdp", "8",
            "--batch", "4"]  # fmt: skip
    assert main(argv) == 2
    cli_message = capsys.readouterr().err.split("error: ", 1)[1].strip()
    assert "--dp * --fsdp * --grad-accum must divide --batch" in cli_message  # in flags
    _, errors = setup_of({**START, "fsdp": 8, "batch": 4})
    as_fields = re.sub(r"--([a-z0-9-]+)", lambda m: m.group(1).replace("-", "_"), cli_message)
    assert errors == {"batch": as_fields}  # under the widget that mends dp (no widget)


def test_layout_needs_hardware_and_budget_needs_a_layout():
    with pytest.raises(SpecError, match="hardware is required with tp, gpus") as err:
        build({"model": "gpt2", "tp": 2, "gpus": 2})
    assert err.value.field == "hardware"


def test_training_days_and_cost_are_quantities():
    setup = build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 8, "fsdp": 8,
                   "batch": 64, "token_budget": 1e12, "price_per_hour": 2.5})  # fmt: skip
    v = setup.estimate().values
    days = 1e12 / v["tokens_per_s"] / 86400
    assert v["train_days"] == pytest.approx(days, rel=1e-12)
    assert v["train_cost"] == pytest.approx(days * 24 * 8 * 2.5, rel=1e-12)
    plain = estimate(setup.model, setup.train, setup.parallel, setup.hardware)
    assert "train_days" not in plain.values and "train_cost" not in plain.values


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hbm_bw": float("nan")}, "hbm_bw"),
        ({"link_bw": -1.0}, "link_bw"),
        ({"network_latency_s": float("inf")}, "network_latency_s"),
        ({"devices_per_node": 0}, "devices_per_node"),
        ({"kind": "fpga"}, "kind"),
        ({"peak_flops": {"bf16": float("nan")}}, "peak_flops.bf16"),
        ({"efficiency": {"matmul": 1.5}}, "efficiency"),
    ],
)
def test_hardware_profiles_are_checked_field_by_field(change, field):
    data = {**HARDWARE["h100-sxm"], **change}
    with pytest.raises(SpecError) as err:
        hardware_from_dict("bad", data)
    assert err.value.field == field and "hardware bad:" in str(err.value)


def test_a_profile_that_is_not_an_object_is_one_clear_line(tmp_path, capsys):
    path = tmp_path / "list.json"
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(SpecError, match="must hold a JSON object"):
        get_hardware(str(path))
    assert main(["estimate", "--model", "gpt2", "--hardware", str(path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_rules_are_the_same_for_specs_and_grids():
    with pytest.raises(SpecError) as one:
        ModelSpec(vocab=10, d_model=64, n_layers=1, n_heads=8, n_kv_heads=3, d_ff=64)
    from costmodel import sweep

    with pytest.raises(SpecError) as grid:
        sweep(get_model("cs336-small"), n_kv_heads=[12, 5])
    assert one.value.field == grid.value.field == "n_kv_heads"
    assert "n_kv_heads must divide n_heads" in str(one.value) and str(grid.value)


@pytest.mark.parametrize("value", [2**53 + 1, 10**400, 10**5000], ids=["2^53+1", "1e400", "1e5000"])
def test_sizes_above_2_to_the_53_are_one_clear_line(value):
    with pytest.raises(SpecError, match=r"d_model must be <= 2\^53 \(got an integer of \d+ bits\)"):
        build({"model": "gpt2", "d_model": value})


def test_an_fsdp2_plan_row_reproduces_in_estimate_without_stating_the_reduce_dtype():
    """Issue 35: the planner's FSDP2 rows reduce in fp32 (the framework's default); an
    estimate of the same layout that does not state the reduce dtype gets the same time."""
    from costmodel.engine.plan import LAYOUT, PlanOptions, plan

    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    train = TrainSpec(batch=32, seq=2048)
    options = PlanOptions(frameworks=("fsdp2",), recompute=("full",), interleave=(1,),
                          micro_batches=(1,))  # fmt: skip
    result = plan(model, train, hw, 8, options)
    row = int(result.order[0])
    layout = {k: result.columns[k][row] for k in LAYOUT}
    layout = {k: v.item() if hasattr(v, "item") else v for k, v in layout.items()}
    assert layout.pop("grad_reduce_fp32") is True
    train = train.replace(recompute=layout.pop("recompute"), grad_accum=layout.pop("grad_accum"))
    layout.pop("micro_batch")
    assert (layout.pop("gpus"), layout.pop("batch")) == (8, 32)  # the row's own count, batch
    got = estimate(model, train, ParallelSpec(**layout), hw).values["time_s.step"]
    assert got == pytest.approx(result.values["time_s.step"][row], rel=1e-9)


def test_a_batch_not_given_divides_over_the_data_parallel_devices():
    """``estimate --model llama3-8b --hardware h100-sxm --gpus 8`` refused the default
    batch of 4 over 8 replicas; a batch not given is the smallest multiple of the
    data-parallel devices from 4 up, and the note says so. A given batch is kept."""
    setup = build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 8})
    assert setup.train.batch == 8 and setup.train.grad_accum == 1
    assert "batch 8 sequences of 1024 tokens per step (set --batch to change)" in setup.notes
    setup = build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 24, "tp": 8})
    assert setup.train.batch == 6 and setup.parallel.dp * setup.parallel.fsdp == 3
    setup = build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 2})
    assert setup.train.batch == 4 and setup.notes[1].startswith("batch 4 sequences")
    assert setup.notes[0].startswith("seq 1,024 tokens, the default")
    # issue 60's fourth probe: the error named --dp, --fsdp and --grad-accum, none given
    with pytest.raises(
        SpecError,
        match=r"batch 4 does not split over the 8 data-parallel "
        r"devices of gpus 8 \(dp x fsdp = 8\): give batch 8, or gpus",
    ):
        build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 8, "batch": 4})
    with pytest.raises(SpecError, match="give batch 24 or 36"):
        build({"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 12, "batch": 32})


@pytest.mark.parametrize(("framework", "stage"), [("megatron", 1), ("fsdp2", 3)])
def test_a_framework_that_shards_its_own_way_runs_its_stage_and_refuses_zero(framework, stage):
    """Issue 60's probe: ``--zero 2`` under Megatron was silently ignored (and its JSON said
    ZeRO-3 where ``plan`` said 1); under FSDP2 it changed the communication, not the memory.
    A framework without ZeRO stages runs its own (the planner's) and refuses --zero."""
    base = {"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 8, "framework": framework}
    assert build(base).parallel.zero == stage
    with pytest.raises(SpecError) as err:
        build({**base, "zero": 2})
    assert err.value.field == "zero" and f"framework={framework} shards as" in str(err.value)
    assert build({**base, "framework": "deepspeed", "zero": 2}).parallel.zero == 2


def test_a_tp_past_the_kv_heads_says_they_are_replicated():
    """Issue 60's fourth probe: tp 16 on Llama-3-8B's 8 KV heads was priced with no remark
    (costmodel replicates each over 2 ranks, as vLLM does; the training frameworks need tp
    to divide them)."""
    base = {"model": "llama3-8b", "hardware": "h100-sxm", "seq": 4096}
    said = "tp 16 is more than the 8 KV heads: each is replicated over 2 ranks"
    assert any(said in n for n in build({**base, "gpus": 16, "tp": 16}).notes)
    assert not any("KV heads" in n for n in build({**base, "gpus": 8, "tp": 8}).notes)
