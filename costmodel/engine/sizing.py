"""Sizing a training run: how many GPUs, how many days, how many dollars (issue 37).

From a plan over device counts (``plan --max-gpus``): for each count, its fastest layout
that fits; training ``token_budget`` tokens at that layout's tokens/s takes

    days = token_budget / tokens_per_s / 86,400,   GPU-hours = days x 24 x GPUs,

and costs GPU-hours x the price per GPU-hour. At one count the fastest layout is also the
cheapest (the price is per GPU-hour), so one row per count is the whole trade-off. The
Pareto front keeps the counts that no other count beats on both days and GPU-hours; with
a deadline, the answer is the cheapest count that meets it (ties: the faster).

Goodput (:class:`Reliability`, with a checkpoint bandwidth): failures arrive at a rate per
GPU-hour (default: Llama 3 405B's pre-training, 419 unexpected interruptions in 54 days on
16,384 H100; Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.3.4), so a job on N
GPUs fails every M = 1 / (rate x N) hours. A blocking checkpoint of the trained state
(weights and optimizer state) takes delta = bytes / bandwidth; it is written every
tau = sqrt(2 delta M) of work (Young 1974, "A first order approximation to the optimum
checkpoint interval"), and each failure loses the restart time R and on average half an
interval and checkpoint. Wall time per unit of work is then
(1 + delta / tau) / (1 - (R + (tau + delta) / 2) / M) (Daly 2006, first order); goodput is
its inverse, and the effective days are days / goodput. Energy: GPUs x ``power_w`` (the
datasheet's maximum: an upper bound) x the effective hours x PUE.

Assumptions, stated with every answer (:data:`ASSUMPTIONS`): MFU is predicted per count
(each count's own layouts, communication and bubble), not held constant; the global batch
is what the user allows (``--global-batch``), with no critical-batch limit of its own (the
critical batch grows during training and is measured from the gradient noise scale,
McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", not derived from the
layout); without a checkpoint bandwidth every step runs (goodput 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.engine.plan import pareto_front
from costmodel.single.precision import PRECISIONS, optimizer_state_bytes
from costmodel.specs import checks
from costmodel.specs.checks import SpecError

SECONDS_PER_DAY = 86_400
NO_CRITICAL_BATCH = ("no critical-batch limit is modelled (McCandlish et al. 2018 measure it "
                     "from the gradient noise scale)")  # fmt: skip
"""What bounds a searched batch range besides the range: nothing (said where one is searched)."""
ASSUMPTIONS = (
    "MFU predicted per GPU count (its own layouts and communication), not held constant",
    f"global batch within the range given; {NO_CRITICAL_BATCH}",
    "goodput from failures per GPU-hour, a blocking checkpoint every Young/Daly interval "
    "and the restart time (with a checkpoint bandwidth; else goodput 1)",
)
LLAMA3_FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16_384)
"""Unexpected interruptions per GPU-hour in Llama 3 405B's pre-training: 419 in a 54-day
snapshot on 16,384 H100 (Dubey et al. 2024, Sec. 3.3.4): 1.97e-5."""


def train_days(token_budget: float, tokens_per_s: float) -> float:
    """Days of work to train on ``token_budget`` tokens at ``tokens_per_s``."""
    return token_budget / tokens_per_s / SECONDS_PER_DAY


@dataclass(frozen=True)
class Reliability:
    """What turns days of work into days on the calendar (goodput) and into energy."""

    checkpoint_gbps: float | None = None
    """Aggregate write bandwidth of a checkpoint, GB/s (None: no goodput model)."""
    failures_per_gpu_hour: float = LLAMA3_FAILURES_PER_GPU_HOUR
    restart_minutes: float = 0.0
    """Minutes from a failure to training again (scheduling, loading the checkpoint)."""
    pue: float = 1.0
    """Facility energy over the devices' (1: the devices' energy alone)."""

    def __post_init__(self) -> None:
        if self.checkpoint_gbps is not None:
            checks.number("checkpoint_gbps", self.checkpoint_gbps)
        checks.number("failures_per_gpu_hour", self.failures_per_gpu_hour, allow_zero=True)
        checks.number("restart_minutes", self.restart_minutes, allow_zero=True)
        checks.number("pue", self.pue)
        if self.pue < 1:
            raise SpecError("pue", f"pue must be >= 1 (facility over device energy; got "
                            f"{self.pue:g})")  # fmt: skip


def goodput(gpus: int, state_bytes: float, rel: Reliability) -> tuple[float, float | None]:
    """(goodput, checkpoint interval in s) of ``gpus`` devices writing ``state_bytes`` per
    checkpoint (Young 1974 interval, Daly 2006 first-order waste; module docstring).
    No bandwidth or no failures: (1, None)."""
    if rel.checkpoint_gbps is None:
        return 1.0, None
    delta = state_bytes / (rel.checkpoint_gbps * 1e9)
    rate = rel.failures_per_gpu_hour * gpus / 3600  # failures per second of the job
    if rate == 0:
        return 1.0, None
    mtbf = 1 / rate
    tau = (2 * delta * mtbf) ** 0.5
    lost = (rel.restart_minutes * 60 + (tau + delta) / 2) / mtbf
    return max(0.0, 1 - lost) / (1 + delta / tau), tau


def checkpoint_bytes(params: float, precision: str, optimizer: str) -> float:
    """What one checkpoint writes: the trained parameters in their stored dtype and the
    optimizer's state (bytes)."""
    return params * PRECISIONS[precision].param + optimizer_state_bytes(
        optimizer, precision, params
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
    meets: bool | None = None  # within the deadline (effective days); None without one
    goodput: float = 1.0
    checkpoint_every_s: float | None = None  # None: no checkpoint model
    effective_days: float = 0.0  # days / goodput: what the calendar sees
    energy_mwh: float | None = None  # None: the device's power is not stated
    energy_cost: float | None = None
    tight: bool = False  # the caching allocator's reserve is over the device's memory

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def sizes(
    plan: Any,
    token_budget: float,
    price_per_hour: float | None = None,
    deadline_days: float | None = None,
    reliability: Reliability | None = None,
    state_bytes: float = 0.0,
    kwh_price: float | None = None,
) -> list[Size]:
    """One :class:`Size` per device count that has a fitting layout, fewest GPUs first.
    ``state_bytes``: what one checkpoint writes (for the goodput); ``kwh_price``: the
    energy's price per kWh (its cost beside the GPU-hours')."""
    rel = reliability or Reliability()
    checks.number("token_budget", token_budget)
    if kwh_price is not None:
        checks.number("kwh_price", kwh_price, allow_zero=True)
    if price_per_hour is not None:
        checks.number("price_per_hour", price_per_hour, allow_zero=True)
    if deadline_days is not None:
        checks.number("deadline_days", deadline_days)
    best, tight = _fastest_per_count(plan)
    rate = plan.values["tokens_per_s"]
    power = float(getattr(plan.hardware, "power_w", 0.0)) if hasattr(plan, "hardware") else 0.0
    out, stalled = [], []
    for g, i in sorted(best.items()):
        days = train_days(token_budget, float(rate[i]))
        good, every = goodput(g, state_bytes, rel)
        if good <= 0:  # failures come faster than a checkpoint interval's work
            stalled.append(g)
            continue
        late = days / good
        hours = late * 24 * g  # GPU-hours on the calendar: the machines are held throughout
        cost = None if price_per_hour is None else hours * price_per_hour
        meets = None if deadline_days is None else late <= deadline_days
        mwh = hours * power * rel.pue / 1e6 if power else None
        energy_cost = None if mwh is None or kwh_price is None else mwh * 1000 * kwh_price
        out.append(Size(i, g, float(rate[i]), days, hours, cost, meets=meets, goodput=good,
                        checkpoint_every_s=every, effective_days=late, energy_mwh=mwh,
                        energy_cost=energy_cost, tight=bool(tight[i])))  # fmt: skip
    if stalled and not out:
        raise SpecError("checkpoint_gbps", f"checkpoint_gbps of {rel.checkpoint_gbps:g} lets no "
                        f"GPU count make progress: on {stalled[0]:,} GPUs failures come faster "
                        "than a checkpoint interval's work (raise the bandwidth)")  # fmt: skip
    return _mark_pareto(out)


def _fastest_per_count(plan: Any) -> tuple[dict[int, int], np.ndarray]:
    """(gpus -> index of its fastest fitting layout, which layouts are TIGHT). A layout
    whose caching allocator reserves more than the device holds (``engine.fit``: its peak
    fits the budget, the allocator may still run out) is a count's answer only where no
    other layout on that count fits, as ``engine.plan.rank`` ranks it after all others."""
    reserved = plan.values.get("memory_bytes_per_device.reserved")
    capacity = getattr(getattr(plan, "hardware", None), "hbm_bytes", np.inf)
    tight = np.zeros(len(plan.fits), dtype=bool) if reserved is None else reserved > capacity
    rate = plan.values["tokens_per_s"]
    best: dict[int, int] = {}
    for i in np.flatnonzero(plan.fits):
        g = int(plan.columns["gpus"][i])
        if g not in best or (tight[best[g]], -rate[best[g]]) > (tight[i], -rate[i]):
            best[g] = int(i)
    return best, tight


def _mark_pareto(rows: list[Size]) -> list[Size]:
    """Mark the counts no other count beats on both calendar days and GPU-hours (of the
    counts whose layout is not TIGHT, where any is not)."""
    pool = [i for i, r in enumerate(rows) if not r.tight] or list(range(len(rows)))
    days = np.array([rows[i].effective_days for i in pool])
    hours = np.array([rows[i].gpu_hours for i in pool])
    front = {pool[j] for j in pareto_front(days, hours).tolist()} if pool else set()
    return [Size(**{**r.to_dict(), "pareto": i in front}) for i, r in enumerate(rows)]


def choose(rows: list[Size], deadline_days: float | None) -> Size:
    """The cheapest count within the deadline (ties: the faster); without a deadline, the
    fastest; a count whose layout is TIGHT only where no other count qualifies. A deadline
    no count meets is a :class:`SpecError` naming the fastest."""
    if not rows:
        raise SpecError("gpus", "no device count has a layout that fits")
    safe = [r for r in rows if not r.tight]
    if safe and (deadline_days is None or any(r.effective_days <= deadline_days for r in safe)):
        rows = safe
    if deadline_days is None:
        return min(rows, key=lambda r: (r.effective_days, r.gpu_hours))
    within = [r for r in rows if r.effective_days <= deadline_days]
    if not within:
        fast = min(rows, key=lambda r: r.effective_days)
        raise SpecError("deadline_days", f"deadline_days of {deadline_days:g} is met by no "
                        f"device count within the budget: the fastest, {fast.gpus:,} GPUs, "
                        f"takes {fast.effective_days:,.1f} days")  # fmt: skip
    return min(within, key=lambda r: (r.gpu_hours, r.effective_days))
