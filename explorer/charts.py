"""Altair charts of one setup: memory vs sequence and batch, FLOPs by op, compute vs
communication vs batch, and the roofline with the ops placed on it. Pure functions of the
specs (no Streamlit), so they are tested and cached outside the page."""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import numpy as np

from costmodel.engine.estimate import estimate
from costmodel.engine.fit import budget_bytes, peak_at
from costmodel.engine.timeline import COLOURS
from costmodel.inputs import Setup
from costmodel.single.precision import PRECISIONS
from costmodel.units import GIB
from explorer.labels import op_name

MEMORY_PARTS = ("frozen", "params", "master", "grads", "optimizer", "buffers", "activations")
"""``frozen``: fine-tuning's frozen weights (0 when every weight trains)."""
TIME_COLOURS = {"compute": COLOURS["compute"], "comm": COLOURS["exposed"]}
"""Compute blue, communication red: the timeline's colours."""


MEMORY_KEYS = tuple(f"memory_bytes_per_device.{p}" for p in (*MEMORY_PARTS, "peak"))
CHART_KEYS = (*MEMORY_KEYS, "time_s.compute", "time_s.comm")
"""What the charts plot."""


def swept(setup: Setup, field: str, values: list[int]) -> tuple[list[int], dict[str, Any]]:
    """``(kept, {key: array})``: :data:`CHART_KEYS` at each value of ``field`` that the
    layout accepts (others are left out). A chart has a dozen points: one estimate each
    (the structure's scalar function, ~1 ms) costs less than building a numpy function of
    the keys for a structure met for the first time (~0.5 s under tp x pp)."""
    kept, rows = [], []
    for value in values:
        try:
            train = setup.train.replace(**{field: value})
            values_at = estimate(setup.model, train, setup.parallel, setup.hardware).values
        except ValueError:
            continue  # not divisible by the layout at this value
        kept.append(value)
        rows.append(values_at)
    return kept, {k: np.array([r.get(k, np.nan) for r in rows], float) for k in CHART_KEYS}


def around(current: int, step: int, octaves: int = 3) -> list[int]:
    """current · 2^k for k in -octaves..octaves, multiples of ``step`` (what the layout can
    split), current included: a memory chart's range around the current setting."""
    values = {current}
    for k in range(1, octaves + 1):
        values |= {current * 2**k, current // 2**k}
    return sorted(x for x in values if x >= step and x % step == 0)


def memory_rows(setup: Setup, field: str, values: list[int]) -> list[dict[str, Any]]:
    """Per-device memory by component at each ``batch`` or ``seq`` value (GiB), with
    ``transient`` (what the peak holds beyond the components: logits, casts, the optimizer's
    temporary) so the stack reaches the peak; where gradients and activations are not live
    together the components add up to more than the peak and transient is 0."""
    keys = MEMORY_KEYS
    kept, res = swept(setup, field, values)
    rows = []
    for i, value in enumerate(kept):
        gib = {key.rsplit(".", 1)[1]: float(res[key][i]) / GIB for key in keys}
        gib["transient"] = max(gib["peak"] - sum(gib[p] for p in MEMORY_PARTS), 0.0)
        rows += [{field: value, "component": c, "GiB": x} for c, x in gib.items()]
    return rows


TABLEAU = (
    "#4c78a8",
    "#f58518",
    "#e45756",
    "#72b7b2",
    "#54a24b",
    "#eeca3b",
    "#b279a2",
    "#ff9da6",
    "#9d755d",
    "#bab0ac",
)
"""Vega's tableau10, the colours a category scale takes by default, in order."""


def memory_chart(setup: Setup, field: str, values: list[int]) -> alt.Chart:
    """Stacked components, the peak (black), the device's capacity (red dashed) and the fit
    rule's budget (orange dashed: a peak above it does not fit), with the current setting
    marked (grey band)."""
    data = memory_rows(setup, field, values)
    parts = [r for r in data if r["component"] != "peak"]
    peaks = [r for r in data if r["component"] == "peak"]
    capacity = setup.hardware.hbm_bytes / GIB
    current = getattr(setup.train, field)
    x = alt.X(f"{field}:O", title=f"{field} (current: {current:,})")
    order = [*MEMORY_PARTS, "transient"]
    # the legend lists the parts drawn (frozen weights, buffers: often none), each in the
    # colour it has wherever it is drawn
    drawn = [c for c in order if any(r["component"] == c and r["GiB"] > 0 for r in parts)]
    colours = alt.Scale(domain=drawn, range=[TABLEAU[order.index(c) % 10] for c in drawn])
    bars = (
        alt.Chart(alt.Data(values=parts))
        .mark_bar()
        .encode(
            x,
            alt.Y("GiB:Q", stack="zero", title="GiB per device"),
            alt.Color("component:N", sort=drawn, scale=colours),
            alt.Order("rank:Q"),
            tooltip=[f"{field}:O", "component:N", alt.Tooltip("GiB:Q", format=".2f")],
        )
        .transform_calculate(rank=f"indexof({order!r}, datum.component)")
    )
    peak = (
        alt.Chart(alt.Data(values=peaks))
        .mark_line(point=True, color="black")
        .encode(x, alt.Y("GiB:Q"),
                tooltip=[f"{field}:O", alt.Tooltip("GiB:Q", format=".2f", title="peak")])
    )  # fmt: skip
    mark = alt.Chart(alt.Data(values=[{field: current}])).mark_rule(color="gray", size=28,
                                                                    opacity=0.25)  # fmt: skip
    rule = alt.Chart(alt.Data(values=[{"GiB": capacity}])).mark_rule(color="red", strokeDash=[6, 3])
    rule = rule.encode(alt.Y("GiB:Q"), tooltip=[alt.Tooltip("GiB:Q", title="capacity")])
    budget = alt.Chart(alt.Data(values=[{"GiB": budget_bytes(setup.hardware) / GIB}]))
    budget = budget.mark_rule(color="orange", strokeDash=[2, 2]).encode(
        alt.Y("GiB:Q"), tooltip=[alt.Tooltip("GiB:Q", format=".1f", title="fit rule's budget")]
    )
    title = (f"Memory per device vs {field} (black: peak, red: {setup.hardware.name} "
             f"capacity, orange: the fit rule's budget)")  # fmt: skip
    if field == "batch":  # the micro-batch grows with it (a probe read batch 32 as the page's)
        title += f"; {held(setup)}"
    said = why_bars_differ(data, field)
    at = peak_at(estimate(setup.model, setup.train, setup.parallel, setup.hardware).values)
    if at is not None:  # where the transients are: at the step, no activations are held
        said.append(f"at {field} {current:,} the peak falls at {at}")
    title = alt.TitleParams(title, subtitle=said)
    return alt.layer(mark.encode(x), bars, peak, rule, budget, title=title)


def why_bars_differ(rows: list[dict[str, Any]], field: str) -> list[str]:
    """The chart's subtitle: what the transient part is and, where the stacked parts add
    up to more than the peak, why (they are not all live at the same moment)."""
    said = ["transient: what the peak holds beyond the parts (logits, casts, the "
            "optimizer's temporary)"]  # fmt: skip
    over: dict[int, float] = {}
    for r in rows:
        sign = -1.0 if r["component"] == "peak" else 1.0
        over[r[field]] = over.get(r[field], 0.0) + sign * r["GiB"]
    worst = max(over, key=over.__getitem__, default=None)
    if worst is not None and over[worst] > 1e-9:
        said.append(f"bars above the black line: gradients and activations are not live at "
                    f"the same moment, so the parts add up to more than the peak (by "
                    f"{over[worst]:,.2f} GiB at {field} {worst:,})")  # fmt: skip
    return said


def _flop_scale(largest: float) -> tuple[float, str]:
    for scale, unit in ((1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP")):
        if largest >= scale:
            return scale, unit
    return 1e6, "MFLOP"


def flops_chart(values: dict[str, float]) -> alt.Chart:
    """FLOPs per step by op and phase, in the scale that suits the largest (T/P/EFLOP)."""
    rows = []
    for phase in ("forward", "backward"):
        prefix = f"flops.{phase}_by_op."
        rows += [
            {"op": op_name(k[len(prefix) :]), "phase": phase, "FLOPs": float(v)}
            for k, v in values.items()
            if k.startswith(prefix) and k != prefix + "total"
        ]
    scale, unit = _flop_scale(max((r["FLOPs"] for r in rows), default=0.0))
    for r in rows:
        r[unit] = r["FLOPs"] / scale
    return (
        alt.Chart(alt.Data(values=rows), title=f"FLOPs per step by op ({unit})")
        .mark_bar()
        .encode(
            alt.X(f"{unit}:Q", stack="zero", title=f"{unit} per step"),
            alt.Y("op:N", sort="-x"),
            alt.Color("phase:N"),
            tooltip=["op:N", "phase:N", alt.Tooltip(f"{unit}:Q", format=",.3f")],
        )
    )


def comm_rows(setup: Setup, batches: list[int]) -> list[dict[str, Any]]:
    kept, res = swept(setup, "batch", batches)
    return [
        {"batch": batch, "time": name, "seconds": float(res[f"time_s.{name}"][i])}
        for i, batch in enumerate(kept)
        for name in ("compute", "comm")
    ]


def crossover(rows: list[dict[str, Any]]) -> int | None:
    """Smallest batch whose compute time reaches its communication time."""
    by_batch: dict[int, dict[str, float]] = {}
    for r in rows:
        by_batch.setdefault(r["batch"], {})[r["time"]] = r["seconds"]
    hits = [b for b, t in sorted(by_batch.items()) if t["compute"] >= t["comm"]]
    return hits[0] if hits else None


def held(setup: Setup, batch: int | None = None) -> str:
    """What a batch sweep holds: the accumulation steps (the micro-batch grows with the
    batch), and at ``batch`` the micro-batch per device that reaches it. A batch raised
    with the micro-batch kept adds steps instead, and FSDP gathers the weights again in
    each: the micro-batch is what makes a step compute-bound (a fifth probe)."""
    steps = setup.train.grad_accum
    fixed = f"grad-accum {steps} held"
    if batch is None:
        return fixed
    micro = batch // setup.parallel.batch_step(steps)  # type: ignore[union-attr]
    return f"{fixed}: micro-batch {micro} per device"


def comm_chart(setup: Setup, batches: list[int]) -> alt.Chart:
    rows = comm_rows(setup, batches)
    drawn = [r for r in rows if r["seconds"] > 0]  # a log axis draws no zero (one device)
    lines = (
        alt.Chart(alt.Data(values=drawn))
        .mark_line(point=True)
        .encode(
            alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title="global batch (sequences)"),
            alt.Y("seconds:Q", scale=alt.Scale(type="log"), title="seconds per step"),
            alt.Color(
                "time:N",
                scale=alt.Scale(domain=list(TIME_COLOURS), range=list(TIME_COLOURS.values())),
            ),
            tooltip=["batch:Q", "time:N", alt.Tooltip("seconds:Q", format=".4g")],
        )
    )
    cross = crossover(rows)
    title = "Compute vs communication per step" + (
        f": compute-bound from batch {cross} ({held(setup, cross)})" if cross
        else f": communication-bound throughout ({held(setup)})"
    )  # fmt: skip
    if cross is None:
        return lines.properties(title=title)
    rule = alt.Chart(alt.Data(values=[{"batch": cross}])).mark_rule(strokeDash=[4, 4])
    return alt.layer(lines, rule.encode(alt.X("batch:Q")), title=title)


def _roof(setup: Setup) -> tuple[float, float]:
    """(achieved matmul FLOP/s, achieved HBM bytes/s): the roofline's two ceilings."""
    dtype = PRECISIONS[setup.train.precision].peak_dtype
    return setup.hardware.matmul_flops(dtype), setup.hardware.hbm_bandwidth()


def roofline_rows(setup: Setup, values: dict[str, float]) -> list[dict[str, Any]]:
    """Each op at its arithmetic intensity, on the attainable-FLOP/s roofline."""
    compute, bandwidth = _roof(setup)
    rows = []
    for key, intensity in values.items():
        # an op the model does not run (no shared experts, no dense blocks) moves nothing
        if key.startswith("roofline.") and key.endswith(".intensity") and intensity > 0:
            rows.append(
                {
                    "op": op_name(key.split(".")[1]),
                    "intensity": intensity,
                    "FLOP/s": min(compute, intensity * bandwidth),
                    "bound": "compute" if intensity * bandwidth >= compute else "memory",
                }
            )
    return rows


def decades(lo: float, hi: float) -> list[float]:
    """The powers of ten from below ``lo`` to above ``hi``: a log axis's ticks, evenly
    spaced (Vega's own log ticks read 1T, 3T, 20T, 100T, 300T: a probe)."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0**k for k in range(first, last + 1)]


def roofline_chart(setup: Setup, values: dict[str, float]) -> alt.Chart:
    ops = roofline_rows(setup, values)
    compute, bandwidth = _roof(setup)
    lo = min([r["intensity"] for r in ops] + [1.0]) / 2
    hi = max([r["intensity"] for r in ops] + [compute / bandwidth]) * 2
    xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    line = [{"intensity": x, "FLOP/s": min(compute, x * bandwidth)} for x in xs]
    low_flops = min([r["FLOP/s"] for r in ops] + [line[0]["FLOP/s"]])
    log = alt.Scale(type="log")
    roof = (
        alt.Chart(alt.Data(values=line))
        .mark_line(color="gray")
        .encode(
            alt.X(
                "intensity:Q",
                scale=log,
                title="arithmetic intensity (FLOP/byte)",
                axis=alt.Axis(format=",~r", values=decades(lo, hi)),
            ),  # 1,000 and 0.5, not 1e+3
            alt.Y(
                "FLOP/s:Q",
                scale=log,
                title="attainable FLOP/s",
                axis=alt.Axis(format="~s", values=decades(low_flops, compute)),
            ),
        )
    )
    points = (
        alt.Chart(alt.Data(values=ops))
        .mark_point(size=90, filled=True)
        .encode(
            alt.X("intensity:Q"),
            alt.Y("FLOP/s:Q"),
            alt.Color("op:N"),
            alt.Shape("bound:N"),
            tooltip=["op:N", alt.Tooltip("intensity:Q", format=".1f"), "bound:N"],
        )
    )
    ridge = compute / bandwidth
    title = (f"Roofline on {setup.hardware.name} at its achieved rates ({compute / 1e12:,.0f} "
             f"TFLOP/s, {bandwidth / 1e12:,.2f} TB/s): ridge at {ridge:.0f} FLOP/byte")  # fmt: skip
    return alt.layer(roof, points, title=title)
