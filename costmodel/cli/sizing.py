"""The sizing part of ``plan`` (``--token-budget`` and what goes with it): per GPU count its
fastest layout's days, goodput, GPU-hours, cost and energy, as text and JSON
(:mod:`costmodel.engine.sizing`)."""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.engine.estimate import estimate
from costmodel.engine.plan import Plan, layout_label
from costmodel.engine.sizing import (
    ASSUMPTIONS,
    Reliability,
    Size,
    checkpoint_bytes,
    choose,
    sizes,
)
from costmodel.specs import checks
from costmodel.specs.checks import SpecError


def add_sizing(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("sizing (with --token-budget)")
    s.add_argument("--deadline-days", type=float, default=None,
                   help="the cheapest GPU count that trains in this many calendar days (use "
                   "--max-gpus to search counts)")  # fmt: skip
    s.add_argument("--checkpoint-gbps", type=float, default=None,
                   help="aggregate checkpoint write bandwidth, GB/s: models failures, Young/Daly "
                   "checkpoints and restarts (goodput); without it every step runs")  # fmt: skip
    s.add_argument("--failures-per-gpu-hour", type=float, default=None,
                   help="unexpected interruptions per GPU-hour (default 1.97e-5: Llama 3's 419 "
                   "in 54 days on 16,384 H100)")  # fmt: skip
    s.add_argument(
        "--restart-minutes",
        type=float,
        default=None,
        help="minutes from a failure to training again (default 0)",
    )
    s.add_argument(
        "--pue",
        type=float,
        default=None,
        help="facility over device energy (default 1: the devices alone)",
    )
    s.add_argument("--kwh-price", type=float, default=None, help="price of a kWh")


def sizing_text(p: Plan, rows: list[Size], budget: float, deadline: float | None) -> str:
    """Per device count its fastest layout's days (of work, and on the calendar with the
    goodput), GPU-hours, cost and energy on ``budget`` tokens, the Pareto front (days
    against GPU-hours) marked, and the answer."""
    good = any(r.checkpoint_every_s is not None for r in rows)
    energy = any(r.energy_mwh is not None for r in rows)
    head = f"{'GPUs':>7} {'days':>9}" + (f" {'goodput':>8} {'calendar':>9}" if good else "")
    head += f" {'GPU-hours':>12} {'cost':>14}" + (f" {'MWh':>8}" if energy else "")
    head += f" {'MFU':>6}  Pareto" + ("  deadline" if deadline is not None else "") + "  layout"
    out = [f"\nsizing: {_tokens(budget)} tokens, per GPU count its fastest layout that fits",
           *(f"  assumes: {a}" for a in ASSUMPTIONS), head]  # fmt: skip
    for r in rows:
        row = p.row(r.index)
        cost = "" if r.cost is None else f"${r.cost:,.0f}"
        meets = "" if r.meets is None else ("  met     " if r.meets else "  missed  ")
        cal = f" {r.goodput:>8.1%} {r.effective_days:>9,.1f}" if good else ""
        mwh = "" if not energy else f" {r.energy_mwh or 0:>8,.0f}"
        out.append(f"{r.gpus:>7,} {r.days:>9,.1f}{cal} {r.gpu_hours:>12,.0f} {cost:>14}{mwh} "
                   f"{row['mfu']:>6.1%}  {'*' if r.pareto else ' ':^6}{meets}  "
                   f"{layout_label(row)}{_TIGHT if r.tight else ''}")  # fmt: skip
    try:
        best = choose(rows, deadline)
    except SpecError as err:
        return "\n".join([*out, _flagged(err.message)])
    why = "the fastest" if deadline is None else f"the cheapest within {deadline:g} days"
    cost = "" if best.cost is None else f", ${best.cost:,.0f}"
    extra = "" if best.energy_mwh is None else f", {best.energy_mwh:,.0f} MWh"
    if best.energy_cost is not None:
        extra += f" (${best.energy_cost:,.0f} of energy)"
    out.append(f"answer ({why}): {best.gpus:,} GPUs, {best.effective_days:,.1f} days, "
               f"{best.gpu_hours:,.0f} GPU-hours{cost}{extra}")  # fmt: skip
    return "\n".join(out)


def deadline_verdict(rows: list[Size], deadline: float | None) -> str | None:
    """With a deadline, the sizing's answer in one line, said before the ranked table
    (whether a device count meets it, the sizing's first question); None without one."""
    if deadline is None:
        return None
    try:
        best = choose(rows, deadline)
    except SpecError as err:
        return f"verdict: {_flagged(err.message)}"
    return (
        f"verdict: {best.gpus:,} GPUs meet the {deadline:g}-day deadline at the least "
        f"GPU-hours ({best.effective_days:,.1f} days; the sizing below)"
    )


def _flagged(message: str) -> str:
    return message.replace("deadline_days", "--deadline-days")


_TIGHT = "  TIGHT: the allocator's reserve is over the device's memory"


def _tokens(n: float) -> str:
    """15e12 -> ``15 T``; 3e11 -> ``300 B``."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:,.4g} {unit}"
    return f"{n:,.0f}"


def reliability(args: argparse.Namespace) -> Reliability:
    """The sizing flags, checked whether or not a budget asks for a sizing."""
    if args.kwh_price is not None:
        checks.number("kwh_price", args.kwh_price, allow_zero=True)
    given = {k: getattr(args, k) for k in SIZED if getattr(args, k) is not None}
    return Reliability(**{k: v for k, v in given.items() if k != "kwh_price"})


SIZED = ("checkpoint_gbps", "failures_per_gpu_hour", "restart_minutes", "pue", "kwh_price")
"""Flags that size a run on a token budget (goodput and energy); unset, Reliability's own
defaults."""


def unsized(args: argparse.Namespace) -> None:
    """A sizing flag, or a price that neither prices a budget nor ranks by cost, given
    without ``--token-budget``: one line naming it (a probe: they changed nothing,
    unsaid)."""
    if args.token_budget is not None:
        return
    for name in ("deadline_days", *SIZED):
        if getattr(args, name) is not None:
            raise SpecError(name, f"{name} sizes a run on --token-budget (the tokens to "
                            "train on): give --token-budget")  # fmt: skip
    if args.price_per_hour and args.objective != "cost":
        raise SpecError("price_per_hour", "price_per_hour prices a --token-budget, or ranks "
                        "the kinds with --objective cost: give one of them")  # fmt: skip


def sized_plan(result: Plan, args: argparse.Namespace, price: float | None) -> list[Size]:
    """The sizing of a plan at ``price`` per device-hour, its checkpoint the best layout's
    trained state."""
    rel = reliability(args)
    params = estimate(result.model, result.train_spec(int(result.order[0])))["params.trainable"]
    state = checkpoint_bytes(params, result.train.precision, result.train.optimizer)
    return sizes(result, args.token_budget, price, args.deadline_days, rel,
                 state, args.kwh_price)  # fmt: skip


def sizing_json(rows: list[Size], deadline: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"assumptions": list(ASSUMPTIONS),
                           "counts": [r.to_dict() for r in rows]}  # fmt: skip
    try:
        out["answer"] = choose(rows, deadline).to_dict()
    except SpecError as err:
        out["no_answer"] = err.message
    return out
