"""Sizing (issue 37): per GPU count its fastest fitting layout, days, GPU-hours and cost on
a token budget, the Pareto front and the cheapest count within a deadline."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from costmodel.cli import main
from costmodel.engine.sizing import (
    LLAMA3_FAILURES_PER_GPU_HOUR,
    Reliability,
    checkpoint_bytes,
    choose,
    goodput,
    sizes,
)
from costmodel.specs.checks import SpecError


def _plan(gpus, rates, fits=None):
    n = len(gpus)
    return SimpleNamespace(
        columns={"gpus": np.array(gpus)},
        values={"tokens_per_s": np.array(rates, float)},
        fits=np.ones(n, bool) if fits is None else np.array(fits),
    )


def test_days_hours_cost_and_the_pareto_front():
    """Per count the fastest fitting layout: 8 GPUs at 1e5 tokens/s (the 2e5 one does not
    fit), 16 at 2e5 (perfect scaling: the same GPU-hours, fewer days), 32 at 3e5 (faster,
    dearer), 64 at 2.5e5 (slower and dearer than 32: off the front)."""
    p = _plan([8, 8, 8, 16, 32, 64], [1e5, 0.5e5, 2e5, 2e5, 3e5, 2.5e5],
              fits=[True, True, False, True, True, True])  # fmt: skip
    rows = sizes(p, token_budget=8.64e11, price_per_hour=2.0)
    assert [r.gpus for r in rows] == [8, 16, 32, 64]
    assert [r.index for r in rows] == [0, 3, 4, 5]
    assert [r.days for r in rows] == pytest.approx([100, 50, 100 / 3, 40])
    assert [r.gpu_hours for r in rows] == pytest.approx([19200, 19200, 25600, 61440])
    assert [r.cost for r in rows] == pytest.approx([38400, 38400, 51200, 122880])
    assert [r.pareto for r in rows] == [False, True, True, False]  # 16 beats 8 on days


def test_the_cheapest_count_within_the_deadline():
    p = _plan([8, 16, 32, 64], [1e5, 2e5, 3e5, 2.5e5])
    rows = sizes(p, 8.64e11, deadline_days=40)
    assert [r.meets for r in rows] == [False, False, True, True]
    assert choose(rows, 40).gpus == 32  # cheaper than 64, both in time
    assert choose(rows, 60).gpus == 16  # 16 and 8 cost alike; 8 misses 60 days
    assert choose(rows, None).gpus == 32  # no deadline: the fastest
    with pytest.raises(SpecError, match=r"deadline_days of 30 .* fastest, 32 GPUs, takes 33\.3"):
        choose(sizes(p, 8.64e11, deadline_days=30), 30)


@pytest.mark.parametrize(("field", "kwargs"), [
    ("token_budget", {"token_budget": 0}), ("price_per_hour", {"price_per_hour": -1}),
    ("deadline_days", {"deadline_days": float("nan")})])  # fmt: skip
def test_bad_sizing_input_names_its_field(field, kwargs):
    args = {"token_budget": 1e12, **kwargs}
    with pytest.raises(SpecError, match=field):
        sizes(_plan([8], [1e5]), **args)


def test_goodput_is_young_daly_first_order():
    """Llama 3 405B's scale: 16,384 GPUs, 405e9 parameters with fp32 weights and Adam's two
    fp32 states (12 bytes each, 4.86 TB) written at 50 GB/s, restarts of 10 minutes."""
    state = checkpoint_bytes(405e9, "bf16-mixed", "adamw")
    assert state == pytest.approx(405e9 * 12)
    rel = Reliability(checkpoint_gbps=50, restart_minutes=10)
    good, every = goodput(16_384, state, rel)
    delta = state / 50e9  # 97.2 s per checkpoint
    mtbf = 3600 / (LLAMA3_FAILURES_PER_GPU_HOUR * 16_384)  # 3.09 h between failures
    assert pytest.approx(1.973e-5, rel=1e-3) == LLAMA3_FAILURES_PER_GPU_HOUR
    assert every == pytest.approx((2 * delta * mtbf) ** 0.5)  # Young: 24.5 minutes
    expected = (1 - (600 + (every + delta) / 2) / mtbf) / (1 + delta / every)
    assert good == pytest.approx(expected) and 0.8 < good < 0.85
    assert goodput(16_384, state, Reliability()) == (1.0, None)  # no bandwidth, no model
    assert goodput(8, state, Reliability(50, failures_per_gpu_hour=0)) == (1.0, None)


def test_calendar_days_energy_and_their_cost():
    """Goodput stretches the calendar (and the GPU-hours the machines are held); energy is
    GPUs x the device's power x the hours x PUE."""
    p = _plan([1024], [1e7])
    p.hardware = SimpleNamespace(power_w=700)
    rel = Reliability(checkpoint_gbps=10, restart_minutes=5, pue=1.2)
    (row,) = sizes(p, 8.64e13, 2.0, None, rel, state_bytes=1e12, kwh_price=0.1)
    good, _ = goodput(1024, 1e12, rel)
    assert row.days == pytest.approx(100) and row.goodput == pytest.approx(good)
    assert row.effective_days == pytest.approx(100 / good)
    assert row.gpu_hours == pytest.approx(100 / good * 24 * 1024)
    assert row.energy_mwh == pytest.approx(row.gpu_hours * 700 * 1.2 / 1e6)
    assert row.energy_cost == pytest.approx(row.energy_mwh * 1000 * 0.1)
    with pytest.raises(SpecError, match="pue must be >= 1"):
        Reliability(pue=0.9)
    slow = Reliability(checkpoint_gbps=1e-6, restart_minutes=5)  # an hour-long checkpoint
    with pytest.raises(SpecError, match="checkpoint_gbps of 1e-06 lets no GPU count make"):
        sizes(p, 8.64e13, reliability=slow, state_bytes=1e12)


PLAN = ["plan", "--model", "cs336-small", "--hardware", "h100-sxm", "--max-gpus", "16",
        "--global-batch", "32", "--seq", "512", "--frameworks", "fsdp2",
        "--recompute", "none", "--token-budget", "1e11"]  # fmt: skip


def test_plan_sizes_a_run_in_json(capsys):
    """The answer is the plan's own fastest row of its count, trained on the budget."""
    assert main([*PLAN, "--price-per-hour", "3", "--deadline-days", "1000", "--json",
                 "--checkpoint-gbps", "20", "--restart-minutes", "5"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    sizing = out["sizing"]
    counts = sizing["counts"]
    assert [c["gpus"] for c in counts] == sorted(c["gpus"] for c in counts)
    best = sizing["answer"]
    assert best["meets"] and best["days"] <= 1000
    assert best["days"] == pytest.approx(1e11 / best["tokens_per_s"] / 86400)
    assert best["effective_days"] == pytest.approx(best["days"] / best["goodput"])
    assert 0.99 < best["goodput"] < 1 and best["checkpoint_every_s"] > 0
    assert best["cost"] == pytest.approx(best["effective_days"] * 24 * best["gpus"] * 3)
    assert best["energy_mwh"] == pytest.approx(best["gpu_hours"] * 700 / 1e6)  # H100 SXM
    cheaper = [c for c in counts if c["meets"] and c["gpu_hours"] < best["gpu_hours"]]
    assert not cheaper
    assert any("critical-batch" in a for a in sizing["assumptions"])


def test_a_deadline_nobody_meets_says_so(capsys):
    assert main([*PLAN, "--deadline-days", "1e-6"]) == 1
    text = capsys.readouterr().out
    said = "--deadline-days of 1e-06 is met by no device count within the budget"
    assert text.startswith(f"verdict: {said}")  # first, in the flag's name (issue 60 probe)
    assert "assumes: goodput from failures per GPU-hour" in text


def test_a_deadline_needs_a_token_budget(capsys):
    args = [a for a in PLAN if a not in ("--token-budget", "1e11")]
    assert main([*args, "--deadline-days", "30"]) == 2
    assert "--deadline-days sizes a run on --token-budget" in capsys.readouterr().err


def _page() -> None:
    from explorer.plan_page import plan_page

    plan_page()


def test_plan_page_sizes_a_run_over_gpu_counts():
    """Up to 16 GPUs, 1e11 tokens at $2 per GPU-hour within 1,000 days: one row per count,
    the answer the table's cheapest count within the deadline, the chart beside it."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_page, default_timeout=300)
    for key, value in {"model": "gpt2", "hardware": "h100-sxm", "gpus": "16", "seq": "1024",
                       "batch": "32", "count": "up to", "tokens": "1e11", "price": "2",
                       "deadline": "1000", "recompute": "none"}.items():  # fmt: skip
        at.query_params[key] = value
    at.run()
    assert not at.exception and not at.error
    sizing = at.dataframe[1].value
    assert list(sizing["GPUs"]) == sorted(sizing["GPUs"]) and len(sizing) > 3
    within = sizing[sizing["within deadline"] == "✓"]
    answer = at.success[0].value  # "The cheapest within 1000 days: N GPUs, ..."
    gpus = int(answer.split(": ")[1].split(" GPUs")[0].replace(",", ""))
    chosen = sizing[sizing["GPUs"] == gpus].iloc[0]
    assert chosen["within deadline"] == "✓"
    assert chosen["GPU-hours"] == within["GPU-hours"].min()  # (as rounded in the table)
    assert (abs(sizing["cost ($)"] - 2 * sizing["GPU-hours"]) <= 1).all()
    assert len(at.get("vega_lite_chart")) == 3  # sizing, Pareto of layouts, timeline
    assert any("critical-batch" in c.value for c in at.caption)


def test_a_tight_layout_answers_a_count_only_where_nothing_else_fits():
    """Per count the fastest layout whose allocator's reserve the device holds; a TIGHT one
    (reserve over memory) only where it is the count's one fit, never on the Pareto front
    while another count is not tight, and the answer only where no other count qualifies."""
    gib = 2**30
    plan = SimpleNamespace(
        fits=np.array([True, True, True]),
        columns={"gpus": np.array([8, 8, 16])},
        values={
            "tokens_per_s": np.array([2.0e5, 1.9e5, 3.0e5]),
            "memory_bytes_per_device.reserved": np.array([82, 70, 82]) * gib,
        },
        hardware=SimpleNamespace(hbm_bytes=80 * gib, power_w=0.0),
    )
    eight, sixteen = sizes(plan, 1e12)
    assert (eight.index, eight.tight) == (1, False)  # the slower layout that is held
    assert sixteen.tight and not sixteen.pareto and eight.pareto
    assert choose([eight, sixteen], None) == eight  # though 16 GPUs are faster
    assert choose([sixteen], None) == sixteen  # the only count: its answer, marked
