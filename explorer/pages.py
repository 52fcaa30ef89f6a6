"""The Estimate page: inputs in the sidebar, headline numbers, charts, formulas, export."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from typing import Any

import streamlit as st

from costmodel.engine.fit import judge
from costmodel.engine.verdict import layout_line, peak_named
from costmodel.inputs import Setup
from costmodel.units import GIB, fmt_count, fmt_quantity
from explorer import charts
from explorer.formulas import formulas_tab
from explorer.inverse import inverse_tab
from explorer.sidebar import init_state, sidebar, url_problems
from explorer.state import failing_field, nearest_valid, setup_of


def _headline(setup: Setup, v: dict[str, float], stale: bool = False) -> None:
    """The verdict first, by the one fit rule (``engine.fit.judge``, default headroom), with
    the layout as costed and its assumptions beside it."""
    assert setup.parallel is not None and setup.hardware is not None
    cols = st.columns(6)
    fit = judge(v, setup.hardware)
    devices = setup.parallel.devices
    off = {"delta_color": "off", "delta_arrow": "off"}
    cols[0].metric("parameters", fmt_count(v["params.total"]).split(" (")[-1].rstrip(")"))
    cols[1].metric("memory per device (GiB)", f"{fit.peak_bytes / GIB:,.2f}",
                   f"budget {fit.budget_bytes / GIB:,.1f} GiB ({fit.headroom:g} of "
                   f"{fit.capacity()})", **off)  # fmt: skip
    cols[2].metric("step time (s)", f"{v['time_s.step']:.4g}")
    cols[3].metric("tokens/s", f"{v['tokens_per_s']:,.0f}")
    if not fit.fits:  # a layout that cannot run has no utilisation, duration or cost
        cols[4].metric("MFU", "–", "does not fit", **off)
        cols[5].metric("days to train", "–", "does not fit", **off)
    else:
        named, _ = peak_named(setup.train, setup.hardware)
        cols[4].metric("MFU", f"{100 * v['mfu']:.1f} %", f"of {named}", **off)
        if "train_days" in v:
            cost = f"${v['train_cost']:,.0f}" if "train_cost" in v else "set a price"
            cols[5].metric("days to train", f"{v['train_days']:,.2f}", cost, **off)
        else:
            cols[5].metric("days to train", "–", "set a token budget", **off)
    where = f"on {devices} × {setup.hardware.name} (dp={setup.parallel.dp})"
    said = fit.sentence().split(": ", 1)[1]
    if stale:  # no green "Fits" for inputs that are not the current ones
        st.info(f"Last valid inputs: {fit.peak_bytes / GIB:,.2f} GiB per device {where}.")
    elif fit.fits:
        st.success(f"Fits: {said} (per device, {where}).")
    else:
        st.error(f"Does not fit: {said} (per device, {where}). Try the inverse questions below.")
    st.caption(f"Layout: {layout_line(setup.train, setup.parallel, setup.hardware)}")


@st.cache_data(show_spinner=False, max_entries=256)
def _chart_spec(kind: str, setup: Setup, values_key: tuple) -> dict:
    """A chart's Vega-Lite spec (Altair's schema validation skipped: the builders are tested).

    Memory charts span the current batch or length (x 1/8 to x 8); the communication sweep
    is keyed without the batch, so changing the batch does not recompute it.
    """
    step = setup.parallel.batch_step(setup.train.grad_accum)
    if kind == "memory_seq":
        seqs = charts.around(setup.train.seq, setup.parallel.seq_step())
        chart = charts.memory_chart(setup, "seq", seqs)
    elif kind == "memory_batch":
        chart = charts.memory_chart(setup, "batch", charts.around(setup.train.batch, step))
    elif kind == "comm":
        chart = charts.comm_chart(setup, [step * 2**k for k in range(12)])
    elif kind == "flops":
        chart = charts.flops_chart(dict(values_key))
    else:
        chart = charts.roofline_chart(setup, dict(values_key))
    return chart.to_dict(validate=False)


_SWEPT = {"comm": "batch"}


def _chart(kind: str, setup: Setup, v: dict[str, float]) -> None:
    key = ()
    if kind in _SWEPT:  # the swept field's current value does not change the chart
        field = _SWEPT[kind]
        setup = dataclasses.replace(
            setup, train=setup.train.replace(**{field: _swept_base(setup, field)})
        )
    else:
        key = tuple(sorted((k, x) for k, x in v.items() if k.startswith(("flops.", "roofline."))))
    st.vega_lite_chart(_chart_spec(kind, setup, key), width="stretch")


def _swept_base(setup: Setup, field: str) -> int:
    """A valid placeholder for the swept field (the layout's batch step, or one token)."""
    if field == "seq":
        return setup.parallel.seq_step()
    return setup.parallel.batch_step(setup.train.grad_accum)


def _table(rows: dict[str, Any]) -> None:
    """Quantities in their units (GiB, ms, FLOP); the exact numbers are in the Export tab."""
    data = [{"quantity": k, "value": fmt_quantity(k, val)} for k, val in rows.items()]
    st.dataframe(data, hide_index=True)


STALE_CSS = "<style>.st-key-stale { opacity: 0.45; filter: grayscale(1); }</style>"


def estimate_page() -> None:
    start = time.perf_counter()
    init_state()
    with st.sidebar:
        values, uploaded, slots = sidebar()
    st.title("What will training this transformer cost?")
    problems = url_problems()
    if problems:
        st.warning("Link parameters not used:\n" + "\n".join(f"- {p}" for p in problems))
    setup, errors = setup_of(values, uploaded)
    stale = setup is None
    if setup is None:
        _explain(values, uploaded, errors, slots)
        setup = st.session_state.get("_last_setup")
        if setup is None:
            return
        st.html(STALE_CSS)
    st.session_state["_last_setup"] = setup
    with st.container(key="stale" if stale else "result"):
        _result(setup, stale)
    st.caption(f"computed in {1e3 * (time.perf_counter() - start):.0f} ms")


def _explain(values: dict[str, Any], uploaded: Any, errors: dict[str, str], slots: dict) -> None:
    """The error beside its widget and at the top, with the nearest value that works."""
    for section, message in errors.items():
        slots[section].error(message, icon="⚠️")
    st.error(f"Fix the input in the sidebar: {next(iter(errors.values()))}")
    field = failing_field(values, uploaded)
    near = nearest_valid(values, field, uploaded) if field else None
    if near is not None:
        st.button(f"Use {field} = {near:,} (the nearest value that works)",
                  on_click=st.session_state.__setitem__, args=(field, near))  # fmt: skip


def _result(setup: Setup, stale: bool) -> None:
    v = setup.estimate().values
    _headline(setup, v, stale)
    tabs = st.tabs(["Memory", "Time", "Roofline", "Formulas", "Inverse questions", "Export"])
    with tabs[0]:
        _chart("memory_seq", setup, v)
        _chart("memory_batch", setup, v)
        _table({k: v[k] for k in v if k.startswith("memory_bytes_per_device.")})
    with tabs[1]:
        _chart("comm", setup, v)
        _chart("flops", setup, v)
        _table({k: v[k] for k in v if k.startswith(("time_s.", "comm_bytes.", "comm_time_s."))})
    with tabs[2]:
        _chart("roofline", setup, v)
    with tabs[3]:
        formulas_tab(setup, v)
    with tabs[4]:
        inverse_tab(setup)
    with tabs[5]:
        _export(v)


def _export(v: dict[str, float]) -> None:
    st.download_button(
        "estimate.json", json.dumps(v, indent=2), "estimate.json", "application/json"
    )
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["quantity", "value"])
    writer.writerows(v.items())
    st.download_button("estimate.csv", buf.getvalue(), "estimate.csv", "text/csv")
