"""Charts and links of the Plan page: memory vs step time over every layout (the fitting
region shaded, the Pareto front drawn: ``costmodel.engine.plan.pareto_front``), one
layout's step timeline, and the Estimate-page URL of a layout. Pure functions of a
:class:`costmodel.engine.plan.Plan` (no Streamlit)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import altair as alt
import numpy as np

from costmodel.engine.plan import Plan, layout_label, pareto_front
from costmodel.engine.sizing import Size
from costmodel.engine.timeline import COLOURS, LANES, LEGEND, Segment
from costmodel.units import GIB
from explorer.state import to_query

MAX_POINTS = 4000
"""Layouts drawn in the scatter (a browser slows down beyond a few thousand marks): the
Pareto front and the top ones always, the rest an even sample."""


def scatter_rows(p: Plan, top: int = 10) -> list[dict[str, Any]]:
    """One row per drawn layout: GiB, seconds, whether it fits, front/top membership.
    The Pareto front is of the layouts that fit: a point beyond the budget is only ever
    "does not fit", so nothing of the front is drawn outside the shaded region."""
    peak = p.values["memory_bytes_per_device.peak"]
    step = p.values["time_s.step"]
    fitting = np.flatnonzero(p.fits)  # the front of what can run: none beyond the budget
    front = fitting[pareto_front(peak[fitting], step[fitting])] if fitting.size else fitting
    ranked = p.order[:top]
    rng = np.random.default_rng(0)
    sample = rng.choice(len(peak), size=min(len(peak), MAX_POINTS), replace=False)
    shown = np.unique(np.concatenate([front, ranked, sample]))
    is_front, is_top = np.isin(shown, front), np.isin(shown, ranked)
    rows = []
    for i, f, t in zip(shown.tolist(), is_front.tolist(), is_top.tolist(), strict=True):
        kind = ("does not fit" if not p.fits[i] else "top" if t else "Pareto front" if f
                else "fits")  # fmt: skip
        rows.append({"GiB": float(peak[i]) / GIB, "seconds": float(step[i]), "kind": kind,
                     "layout": layout_label(p.row(i)) if (f or t) else ""})  # fmt: skip
    return rows


def pareto_chart(p: Plan, top: int = 10) -> alt.LayerChart:
    """Peak memory per device vs step time of every layout; the budget shaded."""
    rows = scatter_rows(p, top)
    budget = p.budget_bytes / GIB
    colours = alt.Scale(domain=["top", "Pareto front", "fits", "does not fit"],
                        range=["#e45756", "#4c78a8", "#9ecae9", "#d3d3d3"])  # fmt: skip
    low = min(r["GiB"] for r in rows) / 1.2
    region = (
        alt.Chart(alt.Data(values=[{"x": low, "x2": budget}]))
        .mark_rect(opacity=0.12, color="#54a24b")
        .encode(alt.X("x:Q"), alt.X2("x2:Q"))
    )
    points = (
        alt.Chart(alt.Data(values=rows))
        .mark_circle(size=28)
        .encode(
            alt.X("GiB:Q", scale=alt.Scale(type="log"), title="peak memory per device (GiB)"),
            alt.Y("seconds:Q", scale=alt.Scale(type="log"), title="step time (s)"),
            alt.Color("kind:N", scale=colours, title=""),
            alt.Order("kind:N"),
            tooltip=[
                "layout:N",
                alt.Tooltip("GiB:Q", format=",.1f"),
                alt.Tooltip("seconds:Q", format=".4g"),
            ],
        )
    )
    title = (f"{p.valid:,} layouts: memory vs step time (green: fits in {budget:,.0f} GiB, "
             f"{p.options.memory_headroom:.0%} of HBM)")  # fmt: skip
    return alt.layer(region, points, title=title)


def sizing_chart(rows: list[Size], deadline: float | None) -> alt.LayerChart:
    """Days against GPU-hours (or cost), one point per GPU count, the Pareto front joined,
    the deadline a vertical rule."""
    money = all(r.cost is not None for r in rows)
    y = "cost" if money else "GPU-hours"
    data = [{"GPUs": r.gpus, "days": r.days, "GPU-hours": r.gpu_hours, "cost": r.cost,
             "front": "Pareto front" if r.pareto else "dominated"} for r in rows]  # fmt: skip
    colours = alt.Scale(domain=["Pareto front", "dominated"], range=["#4c78a8", "#bab0ac"])
    base = alt.Chart(alt.Data(values=data))
    x = alt.X("days:Q", scale=alt.Scale(type="log"), title="days to train")
    points = base.mark_circle(size=60).encode(
        x, alt.Y(f"{y}:Q", scale=alt.Scale(zero=False), title=y if money else "GPU-hours",
                 axis=alt.Axis(format="$,.3~s" if money else ",.3~s")),  # $1.2M, not 1200000
        alt.Color("front:N", scale=colours, title=""),
        tooltip=["GPUs:Q", alt.Tooltip("days:Q", format=",.1f"),
                 alt.Tooltip("GPU-hours:Q", format=",.0f"),
                 alt.Tooltip("cost:Q", format="$,.0f")])  # fmt: skip
    front = (base.transform_filter(alt.datum.front == "Pareto front")
             .mark_line(color="#4c78a8").encode(x, alt.Y(f"{y}:Q")))  # fmt: skip
    layers = [front, points]
    if deadline is not None:
        rule = alt.Chart(alt.Data(values=[{"days": deadline}])).mark_rule(
            color="#e45756", strokeDash=[6, 4]).encode(alt.X("days:Q"))  # fmt: skip
        layers.append(rule)
    return alt.layer(
        *layers,
        title="Each GPU count's fastest layout: days against "
        f"{'cost' if money else 'GPU-hours'} (red dashed: the deadline)",
    )


def timeline_chart(segs: list[Segment]) -> alt.Chart:
    """One step as lanes of bars (compute; overlapped and exposed communication)."""
    rows = [{"lane": s.lane, "label": s.label, "kind": LEGEND[s.kind], "start_ms": s.start * 1e3,
             "end_ms": s.end * 1e3, "ms": s.seconds * 1e3} for s in segs]  # fmt: skip
    drawn = {s.kind for s in segs if s.seconds > 0}  # the legend lists what has a bar
    kinds = [k for k in COLOURS if k in drawn]
    colours = alt.Scale(domain=[LEGEND[k] for k in kinds], range=[COLOURS[k] for k in kinds])
    return (
        alt.Chart(alt.Data(values=rows), title="One step, predicted (hover for each phase)")
        .mark_bar()
        .encode(
            alt.X("start_ms:Q", title="ms from the start of the step"),
            alt.X2("end_ms:Q"),
            alt.Y("lane:N", sort=list(LANES), title=None, axis=alt.Axis(labelLimit=300)),
            alt.Color("kind:N", scale=colours, title=""),
            tooltip=[
                "label:N",
                alt.Tooltip("ms:Q", format=",.2f"),
                alt.Tooltip("start_ms:Q", format=",.2f", title="from ms"),
            ],
        )
        .properties(height=alt.Step(34))  # one band per lane (a mark height collapses them)
    )


def estimate_link(p: Plan, i: int, model_key: str) -> str:
    """The Estimate page's URL for layout ``i`` (its inputs as query parameters)."""
    par, train = p.parallel_spec(i), p.train_spec(i)
    values = {
        "model": model_key, "batch": train.batch, "seq": train.seq,
        "precision": train.precision, "optimizer": train.optimizer,
        "optimizer_impl": train.optimizer_impl, "attention": train.attention,
        "attention_kernel": train.attention_kernel, "elementwise": train.elementwise,
        "recompute": train.recompute,
        "grad_accum": train.grad_accum, "hardware": p.hardware.name,
        "gpus": int(p.columns["gpus"][i]),
        "framework": par.framework, "fsdp": par.fsdp, "zero": par.zero, "tp": par.tp,
        "sequence_parallel": par.sequence_parallel, "pp": par.pp,
        "pp_interleave": par.pp_interleave, "cp": par.cp, "ep": par.ep, "etp": par.etp,
        "ep_dispatcher": par.ep_dispatcher,
        "ep_overlap": par.ep_overlap, "grad_reduce_fp32": par.grad_reduce_fp32,
    }  # fmt: skip
    return "/?" + urlencode(to_query(values))
