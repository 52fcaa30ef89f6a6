"""``plan --hardware A,B,...``: each device kind's best layout, side by side, ranked.

Each kind is searched as ``plan`` searches one (its own node size for ``--max-gpus``, its
own memory for the fit rule); the kinds are then ranked by the same objective on their
best layouts: ``time`` the most tokens per second, ``cost`` the fewest dollars per token
(device-seconds per token x the kind's price per device-hour: a GPU-second of one kind is
not one of another, so cost across kinds needs a price for each), ``tokens-per-gpu`` the
most tokens per second per device, ``mfu`` the highest model FLOPs utilisation (of each
kind's own peak). Units: seconds, tokens, dollars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.catalog.hardware import get_hardware
from costmodel.engine.caveats import calibration_line
from costmodel.engine.plan import Plan, layout_label, score
from costmodel.specs.checks import SpecError
from costmodel.units import GIB


@dataclass
class Searched:
    """One device kind's search: the name the user gave, its plan, its ranked rows."""

    hardware: str
    price: float | None
    plan: Plan
    rows: list[dict[str, Any]]
    seconds: float
    counts: int | list[int]
    """The device counts searched: ``--gpus``, or those of ``--max-gpus`` on this kind."""

    @property
    def best(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None


def prices_for(
    names: list[str], prices: tuple[float, ...] | None, objective: str = "time"
) -> list[float | None]:
    """One price per device kind: none, one for every kind, or one each (in order). A
    ranking of several kinds by ``cost`` needs one each: one price for all would make a
    GPU-hour of one kind cost what one of another does, and decide the ranking unseen."""
    if prices is None:
        return [None] * len(names)
    if len(prices) == 1 and len(names) > 1 and objective == "cost":
        raise SpecError("price_per_hour", f"ranking {len(names)} --hardware kinds by cost "
                        f"needs one --price-per-hour per kind, in their order (got one price "
                        f"for all: a GPU-hour of one kind is not one of another)")  # fmt: skip
    if len(prices) == 1:
        return list(prices) * len(names)
    if len(prices) != len(names):
        raise SpecError("price_per_hour", f"price_per_hour gives {len(prices)} prices for "
                        f"{len(names)} --hardware kinds: give one, or one per kind")  # fmt: skip
    return list(prices)


def merit(row: dict[str, Any], price: float | None, objective: str) -> float:
    """What ``objective`` maximises across kinds, on one kind's best row: the inverse of
    the planner's own score (``costmodel.engine.plan.score``: tokens/s, tokens/s per
    device, MFU), per dollar for ``cost`` (the kind's price per device-hour)."""
    cols = {"gpus": np.array([row["gpus"]])}
    values = {k: np.array([row[k]]) for k in ("tokens_per_s", "mfu")}
    best = 1 / float(score(cols, values, objective)[0])
    if objective == "cost":
        assert price is not None
        return best / (price / 3600)  # tokens per dollar
    return best


def ranked(found: list[Searched], objective: str) -> list[Searched]:
    """Kinds with a fitting layout, best first by ``objective``; then those without."""
    if objective == "cost" and any(s.price is None for s in found):
        raise SpecError("price_per_hour", "comparing device kinds by cost needs "
                        "--price-per-hour for each --hardware (a GPU-hour of one kind is not "
                        "one of another)")  # fmt: skip
    fit = [s for s in found if s.best is not None]
    fit.sort(key=lambda s: -merit(s.best, s.price, objective))  # type: ignore[arg-type]
    return fit + [s for s in found if s.best is None]


_WHAT = {"time": "most tokens/s", "cost": "most tokens per dollar",
         "tokens-per-gpu": "most tokens/s per device", "mfu": "highest MFU"}  # fmt: skip


def compare_text(order: list[Searched], objective: str, no_fit: dict[str, str]) -> str:
    """The kinds' best layouts as a table, best first, and the ones where nothing fits."""
    width = max([40, *(len(layout_label(s.best)) for s in order if s.best)])
    name_w = max(8, *(len(s.hardware) for s in order))
    lines = [f"device kinds compared by {objective} ({_WHAT[objective]}):",
             f"{'#':>3}  {'hardware':<{name_w}} {'GPUs':>6} {'layout':<{width}} {'tok/s':>11} "
             f"{'tok/s/GPU':>10} {'MFU':>6} {'peak GiB':>9}"
             + (f" {'$/GPU-h':>8}" if any(s.price is not None for s in order) else "")]  # fmt: skip
    for i, s in enumerate((s for s in order if s.best), 1):
        r = s.best
        assert r is not None
        extra = f" {s.price:>8,.2f}" if s.price is not None else ""
        extra += f"  {r['train_days']:,.1f} days" if "train_days" in r else ""
        extra += f", ${r['train_cost']:,.0f}" if "train_cost" in r else ""
        lines.append(
            f"{i:>3}  {s.hardware:<{name_w}} {r['gpus']:>6,} {layout_label(r):<{width}} "
            f"{r['tokens_per_s']:>11,.0f} {r['tokens_per_s'] / r['gpus']:>10,.0f} "
            f"{r['mfu']:>6.1%} {r['memory_bytes_per_device.peak'] / GIB:>9.1f}{extra}"
        )
    lines += [f"  {s.hardware}: {no_fit[s.hardware]}" for s in order if s.best is None]
    for s in order:
        hw = get_hardware(s.hardware)
        line = calibration_line(hw, pointer=False)
        top = hw.calibration.get("max_mfu")
        if s.best is not None and top is not None and s.best["mfu"] > top:  # as estimate
            line += (f"; its best row's MFU {s.best['mfu']:.1%} is above it: read it as "
                     "optimistic")  # fmt: skip
        lines.append(f"  calibration of {s.hardware}: {line}")
    return "\n".join(lines)


def compare_json(order: list[Searched], objective: str, no_fit: dict[str, str]) -> list[dict]:
    """Per kind, best first: its search's counts and its best row (or why none fits)."""
    out = []
    for s in order:
        item = {"hardware": s.hardware, "device": s.plan.hardware.name,
                "price_per_hour": s.price, "enumerated": s.plan.enumerated,
                "valid": s.plan.valid, "fitting": int(s.plan.fits.sum()),
                "seconds": s.seconds}  # fmt: skip
        if s.best is None:
            item["no_fit"] = no_fit[s.hardware]
        else:
            item["best"] = s.best
            item["merit"] = merit(s.best, s.price, objective)
        out.append(item)
    return out
