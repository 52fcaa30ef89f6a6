"""``plan --max-gpus N`` (issue 37, item 1): any device count up to a budget, not only all of
it. The counts searched, each row on its own count, its estimate command reproducing it,
and bad budgets refused in one line."""

from __future__ import annotations

import json
import shlex

import pytest

from costmodel import TrainSpec, get_hardware, get_model
from costmodel.cli import main, make_parser
from costmodel.cli.args import values_of
from costmodel.engine.layouts import batch_choices, device_counts
from costmodel.engine.plan import PlanOptions, plan
from costmodel.inputs import build
from costmodel.specs.checks import SpecError


def test_device_counts_are_whole_nodes_of_small_prime_counts():
    counts = device_counts(5128, 8)  # Calculon's question: 641 nodes, a prime
    assert max(counts) == 5120 and 5128 not in counts and 8 * 5**4 in counts
    assert all(c < 8 or c % 8 == 0 for c in counts) and len(counts) < 100
    assert 1000 in device_counts(1000, 8) and 960 in device_counts(1000, 8)
    assert device_counts(5, 8) == [1, 2, 3, 4, 5]
    assert len(device_counts(100_000, 8)) < 200  # bounded however large the budget
    for bad in (0, -8, 1.5):
        with pytest.raises(SpecError, match="max_gpus"):
            device_counts(bad, 8)


@pytest.fixture(scope="module")
def budget_plan():
    model, train = get_model("cs336-small"), TrainSpec(batch=48, seq=512)
    options = PlanOptions(frameworks=("fsdp2", "megatron"), recompute=("none",), interleave=(1,))
    hw = get_hardware("h100-sxm")
    return plan(model, train, hw, device_counts(24, 8), options), plan(model, train, hw, 8, options)


def test_each_row_runs_on_its_own_count_within_the_budget(budget_plan):
    budget, eight = budget_plan
    gpus = budget["gpus"]
    assert set(gpus.tolist()) <= set(device_counts(24, 8)) and {16, 24} <= set(gpus.tolist())
    product = budget["dp"] * budget["fsdp"] * budget["tp"] * budget["pp"] * budget["cp"]
    assert (gpus == product).all()
    # the budget holds the 8-GPU cluster's layouts, so it is never slower
    assert budget["time_s.step"][0] <= eight["time_s.step"][0]
    assert budget.row(int(budget.order[0]))["gpus"] == 24  # the batch splits 24 ways here


def test_a_budget_row_reproduces_in_estimate(budget_plan, capsys):
    argv = ["plan", "--model", "cs336-small", "--hardware", "h100-sxm", "--max-gpus", "24",
            "--global-batch", "48", "--seq", "512", "--frameworks", "fsdp2,megatron",
            "--recompute", "none", "--top", "3", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_gpus"] == 24 and 24 in out["device_counts"]
    for row in out["top"]:
        command = shlex.split(row["estimate_command"])
        assert command[command.index("--gpus") + 1] == str(row["gpus"])
        est = build(values_of(make_parser().parse_args(command[3:]))).estimate()
        assert est["time_s.step"] == pytest.approx(row["time_s.step"], rel=1e-9)
    assert main(argv[:-1]) == 0
    table = capsys.readouterr().out
    assert "on up to 24 (" in table and "GPUs" in table.splitlines()[3]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--gpus", "8", "--max-gpus", "16"], "not allowed with argument"),
        ([], "one of the arguments --gpus --max-gpus is required"),
        (["--max-gpus", "0"], "--max-gpus must be >= 1"),
        (["--max-gpus", "-8"], "--max-gpus must be >= 1"),
    ],
)
def test_a_bad_budget_is_one_line(capsys, extra, words):
    argv = ["plan", "--model", "cs336-small", "--hardware", "h100-sxm", "--global-batch", "8",
            *extra]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


def test_the_cost_objective_ranks_device_seconds_per_token():
    """With a budget the fastest layout uses the most devices; the cheapest per token may
    use fewer. Each objective's best is the best by its own measure among what fits."""
    model, train = get_model("llama3-8b"), TrainSpec(batch=64, seq=4096)
    hw, counts = get_hardware("h100-sxm"), device_counts(64, 8)
    found = {}
    for objective in ("time", "cost", "mfu"):
        options = PlanOptions(frameworks=("fsdp2",), recompute=("none", "full"),
                              interleave=(1,), objective=objective)  # fmt: skip
        found[objective] = plan(model, train, hw, counts, options)
    fast, cheap, mfu = (found[k].row(int(found[k].order[0])) for k in ("time", "cost", "mfu"))
    per_token = {k: r["gpus"] / r["tokens_per_s"] for k, r in (("fast", fast), ("cheap", cheap))}
    assert cheap["gpus"] < fast["gpus"] and per_token["cheap"] < per_token["fast"]
    assert fast["tokens_per_s"] > cheap["tokens_per_s"]
    p = found["cost"]
    fits = p.fits
    every = p["gpus"] / p["tokens_per_s"]
    safe = p["memory_bytes_per_device.reserved"] <= hw.hbm_bytes  # a reserve over the card
    assert per_token["cheap"] <= every[safe].min() * 1.005  # ranks last; the best safe one
    assert cheap["memory_bytes_per_device.reserved"] <= hw.hbm_bytes  # within the tie band
    risky = p["memory_bytes_per_device.reserved"] > hw.hbm_bytes  # ranked order
    assert risky.any() and not (risky[:-1] & ~risky[1:]).any()  # every risky after the safe
    assert "over the device's 80" in p.row(int(p.order[-1]))["limit"]
    m = found["mfu"]
    assert (
        mfu["mfu"] >= m["mfu"][m["memory_bytes_per_device.reserved"] <= hw.hbm_bytes].max() / 1.005
    )
    with pytest.raises(SpecError, match="objective"):
        PlanOptions(objective="speed")
    assert fits.sum() == len(p)


def test_batch_ranges_search_the_largest_even_splitting_batches():
    # Calculon's "global batch <= 2,520": 2,520 = 2^3 3^2 5 7 and the seven below it
    assert batch_choices(1, 2520) == [2304, 2352, 2400, 2401, 2430, 2450, 2500, 2520]
    assert batch_choices(48, 128) == [100, 105, 108, 112, 120, 125, 126, 128]
    assert batch_choices(97, 97) == [97]  # the top of a range is always searched
    for low, high, words in ((64, 32, "min > max"), (0, 8, "global_batch must be >= 1")):
        with pytest.raises(SpecError, match=words):
            batch_choices(low, high)


def test_a_batch_range_row_is_on_its_own_batch_and_reproduces(capsys):
    argv = ["plan", "--model", "cs336-small", "--hardware", "h100-sxm", "--gpus", "8",
            "--global-batch", "20:32", "--seq", "512", "--frameworks", "fsdp2",
            "--recompute", "none", "--top", "3", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["global_batch"] == batch_choices(20, 32)
    for row in out["top"]:
        assert row["batch"] in out["global_batch"]
        command = shlex.split(row["estimate_command"])
        assert command[command.index("--batch") + 1] == str(row["batch"])
        est = build(values_of(make_parser().parse_args(command[3:]))).estimate()
        assert est["tokens_per_s"] == pytest.approx(row["tokens_per_s"], rel=1e-9)
    assert main([*argv[:8], "32:20", *argv[9:]]) == 2
    assert "min > max" in capsys.readouterr().err
