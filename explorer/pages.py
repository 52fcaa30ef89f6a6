"""The Estimate page: inputs in the sidebar, headline numbers, charts, formulas, export."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from typing import Any

import streamlit as st

from costmodel.cli.estimate import summary_rows
from costmodel.engine.fit import judge
from costmodel.engine.quantities import flat
from costmodel.inputs import Setup
from costmodel.units import fmt_quantity
from explorer import charts
from explorer.formulas import formulas_tab
from explorer.headline import current_answer, headline
from explorer.inverse import inverse_tab
from explorer.labels import label
from explorer.page_state import remember_estimate, warn_unused
from explorer.sidebar import init_state, sidebar, url_problems
from explorer.state import defaulted, fixes, setup_of


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


def _lines(rows: list[tuple[str, str]], heading: str) -> None:
    """The CLI's lines under ``heading`` (``estimate``'s summary: parts that add up to the
    peak or the step, transients and contention included), as a table."""
    names = [name for name, _ in rows]
    if heading not in names:
        return
    below = []
    for name, value in rows[names.index(heading) + 1 :]:
        if not name.startswith("  "):
            break
        below.append({"": name.strip(), "value": value})
    st.dataframe(below, hide_index=True)


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
    warn_unused(problems)
    setup, errors = setup_of(values, uploaded)
    _share(values, uploaded, setup)
    stale = setup is None
    left = defaulted(values)  # the defaults the Assumed line names as defaults
    if setup is None:
        _explain(values, uploaded, errors, slots)
        setup, left = st.session_state.get("_last_setup", (None, left))
        if setup is None:
            return
        st.html(STALE_CSS)
    st.session_state["_last_setup"] = (setup, left)
    with st.container(key="stale" if stale else "result"):
        _result(setup, stale, left)
    st.caption(f"computed in {1e3 * (time.perf_counter() - start):.0f} ms")


def _share(values: dict[str, Any], uploaded: Any, setup: Setup | None) -> None:
    """What the Plan, Offload and Padding pages start from: these inputs, the devices the
    layout takes where the GPU count is left empty, and no preset name for an upload."""
    shared = dict(values)
    if shared["gpus"] is None and setup is not None and setup.parallel is not None:
        shared["gpus"] = setup.parallel.devices
    if uploaded is not None:
        shared.pop("model")
    remember_estimate(shared, uploaded=uploaded is not None)


def _explain(values: dict[str, Any], uploaded: Any, errors: dict[str, str], slots: dict) -> None:
    """The error directly under the widget it names, with a button per nearest value that
    works (``explorer.state.fixes``), and a pointer at the top of the page. A widget not
    drawn (LoRA's, without fine-tuning) leaves both at the top."""
    ((key, message),) = errors.items()
    named = "the uploaded config.json" if isinstance(uploaded, str) else label(key)
    st.error(f"Fix **{named}** in the sidebar: {message}")
    with slots[key].container() if key in slots else st.container():
        if key in slots:
            st.error(message, icon="⚠️")
        for field, value in fixes(values, uploaded):
            st.button(f"Use {label(field).split(' (')[0]} = {_shown(value)}", key=f"fix_{field}",
                      on_click=st.session_state.__setitem__, args=(field, value))  # fmt: skip


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _result(setup: Setup, stale: bool, left: frozenset[str] = frozenset()) -> None:
    v = setup.estimate().values
    headline(setup, v, stale, left)
    tabs = st.tabs(["Memory", "Time", "Roofline", "Formulas", "Inverse questions", "Export"])
    fits = judge(v, setup.hardware).fits
    summary = summary_rows(setup.estimate(), fits)
    with tabs[0]:
        _chart("memory_seq", setup, v)
        _chart("memory_batch", setup, v)
        _lines(summary, "memory per device")
        with st.expander("every memory quantity (the names --json and the API use)"):
            _table({k: v[k] for k in v if k.startswith("memory_bytes_per_device.")})
    with tabs[1]:
        _unfit_note(fits)
        _chart("comm", setup, v)
        _chart("flops", setup, v)
        _lines(summary, "time per step")
        with st.expander("every time and communication quantity (as --json names them)"):
            _table({k: v[k] for k in v if k.startswith(("time_s.", "comm_bytes.",
                                                         "comm_time_s."))})  # fmt: skip
    with tabs[2]:
        _chart("roofline", setup, v)
    with tabs[3]:
        _unfit_note(fits)
        formulas_tab(setup, v)
    with tabs[4]:
        _unfit_note(fits)
        inverse_tab(setup)
    with tabs[5]:
        _export(setup, v, stale)


UNFIT_NOTE = (
    "Does not fit: no step of this layout runs. The times, MFU and bounds below "
    "are what it would take if it fitted, as the formulas give them, not an answer."
)
"""What the Time, Formulas and Inverse tabs say first for a layout that does not fit (the
headline gives it no step time or MFU, as the CLI does)."""


def _unfit_note(fits: bool | None) -> None:
    if fits is False:
        st.warning(UNFIT_NOTE)


def export_data(setup: Setup, stale: bool = False) -> dict[str, Any]:
    """``estimate --json``'s object: the verdict first (not for inputs that are not the
    current ones; its nearest fit the planner's once the page asked it), then the model,
    training, layout, device and every quantity by group."""
    data = setup.estimate().to_dict()
    if not stale and setup.parallel is not None:
        data = {"verdict": current_answer(setup), **data}
    return data


def _export(setup: Setup, v: dict[str, float], stale: bool) -> None:
    """The JSON of :func:`export_data` and the same as CSV rows: the verdict, model,
    training, layout and device, then every quantity, by dotted name."""
    data = export_data(setup, stale)
    st.download_button("estimate.json", json.dumps(data, indent=2, allow_nan=False),
                       "estimate.json", "application/json")  # fmt: skip
    st.download_button("estimate.csv", export_csv(data), "estimate.csv", "text/csv")


def export_csv(data: dict[str, Any]) -> str:
    """:func:`export_data` as ``name,value`` rows (nested keys dotted, lists as JSON)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["name", "value"])
    for key, value in flat(data).items():
        writer.writerow([key, json.dumps(value) if isinstance(value, list | dict) else value])
    return buf.getvalue()
