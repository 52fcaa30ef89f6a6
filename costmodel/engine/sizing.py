"""Sizing a training run: how many GPUs, how many days, how many dollars (issue 37).

From a plan over device counts (``plan --max-gpus``): for each count, its fastest layout
that fits; training ``token_budget`` tokens at that layout's tokens/s takes

    days = token_budget / tokens_per_s / 86,400,   GPU-hours = days x 24 x GPUs,

and costs GPU-hours x the price per GPU-hour. At one count the fastest layout is also the
cheapest (the price is per GPU-hour), so one row per count is the whole trade-off. The
Pareto front keeps the counts that no other count beats on both days and GPU-hours; with
a deadline, the answer is the cheapest count that meets it (ties: the faster).

Assumptions, stated with every answer (:data:`ASSUMPTIONS`): MFU is predicted per count
(each count's own layouts, communication and bubble), not held constant; the global batch
is what the user allows (``--global-batch``), with no critical-batch limit of its own (the
critical batch grows during training and is measured from the gradient noise scale,
McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", not derived from the
layout); every step runs: no failures, checkpoints or restarts (goodput 1), no energy cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.specs import checks
from costmodel.specs.checks import SpecError

SECONDS_PER_DAY = 86_400
ASSUMPTIONS = (
    "MFU predicted per GPU count (its own layouts and communication), not held constant",
    "global batch within the range given; no critical-batch limit is modelled "
    "(McCandlish et al. 2018 measure it from the gradient noise scale)",
    "every step runs: no failures, checkpoints or restarts (goodput 1); energy not counted",
)


@dataclass(frozen=True)
class Size:
    """One device count's fastest fitting layout, trained on the whole token budget."""

    index: int  # the layout's row in the plan's columns
    gpus: int
    tokens_per_s: float
    days: float
    gpu_hours: float
    cost: float | None  # dollars (or the price's currency); None without a price
    pareto: bool = False
    meets: bool | None = None  # within the deadline; None without one

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def sizes(
    plan: Any,
    token_budget: float,
    price_per_hour: float | None = None,
    deadline_days: float | None = None,
) -> list[Size]:
    """One :class:`Size` per device count that has a fitting layout, fewest GPUs first."""
    checks.number("token_budget", token_budget)
    if price_per_hour is not None:
        checks.number("price_per_hour", price_per_hour, allow_zero=True)
    if deadline_days is not None:
        checks.number("deadline_days", deadline_days)
    best: dict[int, int] = {}  # gpus: index of the fastest fitting layout
    rate = plan.values["tokens_per_s"]
    for i in np.flatnonzero(plan.fits):
        g = int(plan.columns["gpus"][i])
        if g not in best or rate[i] > rate[best[g]]:
            best[g] = int(i)
    out = []
    for g, i in sorted(best.items()):
        days = token_budget / float(rate[i]) / SECONDS_PER_DAY
        hours = days * 24 * g
        cost = None if price_per_hour is None else hours * price_per_hour
        meets = None if deadline_days is None else days <= deadline_days
        out.append(Size(i, g, float(rate[i]), days, hours, cost, meets=meets))
    return _mark_pareto(out)


def _mark_pareto(rows: list[Size]) -> list[Size]:
    """Mark the counts no other count beats on both days and GPU-hours (fewer of one and
    no more of the other)."""
    marked = []
    for r in rows:
        beaten = any(
            (o.days <= r.days and o.gpu_hours <= r.gpu_hours)
            and (o.days < r.days or o.gpu_hours < r.gpu_hours)
            for o in rows
        )
        marked.append(Size(**{**r.to_dict(), "pareto": not beaten}))
    return marked


def choose(rows: list[Size], deadline_days: float | None) -> Size:
    """The cheapest count within the deadline (ties: the faster); without a deadline, the
    fastest. A deadline no count meets is a :class:`SpecError` naming the fastest."""
    if not rows:
        raise SpecError("gpus", "no device count has a layout that fits")
    if deadline_days is None:
        return min(rows, key=lambda r: (r.days, r.gpu_hours))
    within = [r for r in rows if r.days <= deadline_days]
    if not within:
        fast = min(rows, key=lambda r: r.days)
        raise SpecError("deadline_days", f"deadline_days of {deadline_days:g} is met by no "
                        f"device count within the budget: the fastest, {fast.gpus:,} GPUs, "
                        f"takes {fast.days:,.1f} days")  # fmt: skip
    return min(within, key=lambda r: (r.gpu_hours, r.days))
