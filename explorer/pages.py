"""The Estimate page: inputs in the sidebar, headline numbers, charts, formulas, export."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from typing import Any

import streamlit as st
import sympy as sp

from costmodel.engine.quantities import compiled, structure_of
from costmodel.inputs import Setup
from costmodel.units import GIB, fmt_count
from explorer import charts
from explorer.inverse import inverse_tab
from explorer.sidebar import init_state, sidebar
from explorer.state import setup_of


def _headline(setup: Setup, v: dict[str, float]) -> None:
    assert setup.parallel is not None and setup.hardware is not None
    cols = st.columns(6)
    capacity, peak = setup.hardware.hbm_bytes, v["memory_bytes_per_device.peak"]
    devices = setup.parallel.devices
    cols[0].metric("parameters", fmt_count(v["params.total"]).split(" (")[-1].rstrip(")"))
    cols[1].metric(
        "memory per device (GiB)",
        f"{peak / GIB:,.2f}",
        f"of {capacity / GIB:,.0f} GiB",
        delta_color="off",
        delta_arrow="off",
    )
    cols[2].metric("step time (s)", f"{v['time_s.step']:.4g}")
    cols[3].metric("tokens/s", f"{v['tokens_per_s']:,.0f}")
    cols[4].metric("MFU", f"{100 * v['mfu']:.1f} %")
    if "train_days" in v:
        cost = f"${v['train_cost']:,.0f}" if "train_cost" in v else "set a price"
        cols[5].metric("days to train", f"{v['train_days']:,.2f}", cost, delta_color="off",
                       delta_arrow="off")  # fmt: skip
    else:
        cols[5].metric(
            "days to train", "–", "set a token budget", delta_color="off", delta_arrow="off"
        )
    where = f"on {devices} × {setup.hardware.name} (dp={setup.parallel.dp})"
    if peak <= capacity:
        st.success(f"Fits: {peak / GIB:,.2f} GiB of {capacity / GIB:,.0f} GiB per device {where}.")
    else:
        st.error(
            f"Does not fit: {peak / GIB:,.2f} GiB needed, {capacity / GIB:,.0f} GiB per "
            f"device {where}. Try the inverse questions below."
        )


@st.cache_data(show_spinner=False, max_entries=256)
def _chart_spec(kind: str, setup: Setup, values_key: tuple) -> dict:
    """A chart's Vega-Lite spec (Altair's schema validation skipped: the builders are tested).

    Sweeps are keyed without the swept field, so changing the batch does not recompute the
    batch sweep.
    """
    step = setup.parallel.batch_step(setup.train.grad_accum)
    if kind == "memory_seq":
        chart = charts.memory_chart(setup, "seq", [2**k for k in range(8, 16)])
    elif kind == "memory_batch":
        chart = charts.memory_chart(setup, "batch", [step * 2**k for k in range(8)])
    elif kind == "comm":
        chart = charts.comm_chart(setup, [step * 2**k for k in range(12)])
    elif kind == "flops":
        chart = charts.flops_chart(dict(values_key))
    else:
        chart = charts.roofline_chart(setup, dict(values_key))
    return chart.to_dict(validate=False)


_SWEPT = {"memory_seq": "seq", "memory_batch": "batch", "comm": "batch"}


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


@st.cache_data(show_spinner=False, max_entries=1024)
def _latex(structure: tuple, key: str) -> str:
    """LaTeX of one quantity; expressions depend only on the structure, so cached by it."""
    comp = compiled(structure)
    return sp.latex(comp.exprs[comp.keys.index(key)])


def _table(rows: dict[str, Any]) -> None:
    st.dataframe([{"quantity": k, "value": val} for k, val in rows.items()], hide_index=True)


def estimate_page() -> None:
    start = time.perf_counter()
    init_state()
    with st.sidebar:
        values, uploaded, slots = sidebar()
    st.title("What will training this transformer cost?")
    for problem in st.session_state.get("_problems", []):
        st.warning(problem)
    setup, errors = setup_of(values, uploaded)
    if setup is None:
        for section, message in errors.items():
            slots[section].error(message, icon="⚠️")
        st.error(f"Fix the input in the sidebar: {next(iter(errors.values()))}")
        return
    v = setup.estimate().values
    _headline(setup, v)
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
        _formulas(setup, v)
    with tabs[4]:
        inverse_tab(setup)
    with tabs[5]:
        _export(v)
    st.caption(f"computed in {1e3 * (time.perf_counter() - start):.0f} ms")


def _formulas(setup: Setup, v: dict[str, float]) -> None:
    structure = structure_of(setup.model, setup.train, setup.parallel)
    for key, label in (
        ("params.total", "parameters"),
        ("flops.step", "FLOPs per step"),
        ("memory_bytes_per_device.peak", "peak bytes per device"),
        ("time_s.step", "step time (s)"),
        ("mfu", "MFU"),
    ):
        st.markdown(f"**{label}** = {v[key]:,.6g}")
        st.latex(_latex(structure, key))


def _export(v: dict[str, float]) -> None:
    st.download_button(
        "estimate.json", json.dumps(v, indent=2), "estimate.json", "application/json"
    )
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["quantity", "value"])
    writer.writerows(v.items())
    st.download_button("estimate.csv", buf.getvalue(), "estimate.csv", "text/csv")
