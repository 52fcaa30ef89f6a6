"""The explorer's pages: the estimate (inputs in the sidebar) and validation results."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any

import altair as alt
import streamlit as st
import sympy as sp

from costmodel import PRESETS, ModelSpec, estimate
from costmodel.book.bounds import bounds_report
from costmodel.book.fsdp import min_fsdp
from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.hf import model_from_hf_dict
from costmodel.engine.quantities import compiled, structure_of
from costmodel.single.precision import PRECISIONS
from costmodel.specs import model as S
from costmodel.specs.parallel import OVERLAP_RULES
from costmodel.units import GB, GIB, fmt_count
from explorer import charts
from explorer.state import FIELDS, MODEL_OVERRIDES, Setup, build, from_query, to_query


def init_state() -> None:
    """Session state from the URL on first load (bad parameters become warnings)."""
    if st.session_state.get("_initialised"):
        return
    values, problems = from_query(st.query_params.to_dict())
    for key, value in values.items():
        if value is not None:  # optional overrides stay unset: the widget shows the preset's
            st.session_state[key] = value
    st.session_state["_problems"] = problems
    st.session_state["_initialised"] = True


def _model_inputs():
    st.header("Model")
    upload = st.file_uploader("Hugging Face config.json (optional)", type=["json"])
    st.selectbox("preset", list(PRESETS), key="preset", disabled=upload is not None)
    with st.expander("override fields"):
        for key in MODEL_OVERRIDES:
            unset = {} if key in st.session_state else {"value": None}
            st.number_input(key, min_value=1, step=1, key=key, placeholder="preset's value",
                            **unset)  # fmt: skip
    return upload, st.empty()


def _training_inputs():
    st.header("Training")
    st.number_input("batch (sequences per step)", min_value=1, step=1, key="batch")
    st.number_input("sequence length", min_value=1, step=128, key="seq")
    st.selectbox("precision", S.PRECISIONS, key="precision")
    st.selectbox("optimizer", S.OPTIMIZERS, key="optimizer")
    st.selectbox("optimizer implementation", S.OPTIMIZER_IMPLS, key="optimizer_impl")
    st.selectbox("attention kernel", S.ATTENTION_KERNELS, key="attention")
    st.selectbox("recomputation", S.RECOMPUTE_POLICIES, key="recompute")
    st.number_input("gradient accumulation steps", min_value=1, step=1, key="grad_accum")
    return st.empty()


def _cluster_inputs():
    st.header("Cluster and layout")
    st.selectbox("device", list(HARDWARE), key="hardware")
    st.number_input("GPUs per node", min_value=1, step=1, key="gpus_per_node")
    st.number_input("nodes", min_value=1, step=1, key="nodes")
    cols = st.columns(2)
    cols[0].number_input("fsdp", min_value=1, step=1, key="fsdp")
    cols[1].selectbox("ZeRO stage", [1, 2, 3], key="zero")
    cols[0].number_input("tp", min_value=1, step=1, key="tp")
    cols[1].number_input("pp", min_value=1, step=1, key="pp")
    cols[0].number_input("cp", min_value=1, step=1, key="cp")
    st.checkbox("sequence parallel (with tp)", key="sequence_parallel")
    st.radio("overlap of communication", OVERLAP_RULES, key="overlap", horizontal=True)
    st.caption("dp fills the devices the other degrees leave.")
    return st.empty()


def sidebar() -> tuple[dict[str, Any], ModelSpec | None, dict[str, Any]]:
    """The inputs: their values, an uploaded model (or None), and a message slot per
    section (errors show next to the widgets they are about)."""
    upload, model_slot = _model_inputs()
    slots = {"model": model_slot, "training": _training_inputs(), "cluster": _cluster_inputs()}
    st.header("Budget")
    st.number_input("token budget", min_value=0.0, step=1e9, format="%.3g", key="token_budget")
    st.number_input("$ per device-hour", min_value=0.0, step=0.5, key="price_per_hour")
    values = {f.key: st.session_state.get(f.key, f.default) for f in FIELDS}
    uploaded = None
    if upload is not None:
        try:
            uploaded = model_from_hf_dict(json.loads(upload.getvalue()), upload.name)
        except (ValueError, UnicodeDecodeError) as err:
            model_slot.error(f"{upload.name}: {err}", icon="⚠️")
    st.query_params.from_dict(to_query(values))
    return values, uploaded, slots


def _headline(setup: Setup, v: dict[str, float], values: dict[str, Any]) -> None:
    cols = st.columns(6)
    capacity, peak = setup.hardware.hbm_bytes, v["memory_bytes_per_device.peak"]
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
    tokens = values["token_budget"]
    if tokens:
        days = tokens / (setup.train.batch * setup.train.seq) * v["time_s.step"] / 86400
        cost = days * 24 * setup.devices * values["price_per_hour"]
        cols[5].metric(
            "days to train", f"{days:,.2f}", f"${cost:,.0f}", delta_color="off", delta_arrow="off"
        )
    else:
        cols[5].metric(
            "days to train", "–", "set a token budget", delta_color="off", delta_arrow="off"
        )
    if peak <= capacity:
        st.success(
            f"Fits: {peak / GIB:,.2f} GiB of {capacity / GIB:,.0f} GiB per device "
            f"on {setup.devices} × {setup.hardware.name} (dp={setup.parallel.dp})."
        )
    else:
        st.error(
            f"Does not fit: {peak / GIB:,.2f} GiB needed, {capacity / GIB:,.0f} GiB per "
            f"device on {setup.hardware.name}. Try the inverse questions below."
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
        return setup.parallel.cp * setup.parallel.tp
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
    setup, errors = build(values, uploaded)
    if setup is None:
        for section, message in errors.items():
            slots[section].error(message, icon="⚠️")
        st.error(f"Fix the input in the sidebar: {next(iter(errors.values()))}")
        return
    est = estimate(setup.model, setup.train, setup.parallel, setup.hardware)
    v = est.values
    _headline(setup, v, values)
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
    with tabs[4]:
        _inverse(setup)
    with tabs[5]:
        _export(v)
    st.caption(f"computed in {1e3 * (time.perf_counter() - start):.0f} ms")


def _inverse(setup: Setup) -> None:
    st.subheader("Smallest FSDP degree that fits")
    st.caption(
        "One device's micro-batch share of sequences; half of the activations sharded "
        "(as `costmodel solve min-fsdp`)."
    )
    budget = st.number_input(
        "memory budget (GB = 1e9 bytes)",
        min_value=0.1,
        value=round(setup.hardware.hbm_bytes / GB, 1),
        key="budget_gb",
    )
    sequences = max(1, setup.train.micro_batch // (setup.parallel.dp * setup.parallel.fsdp))
    try:
        result = min_fsdp(setup.model, setup.train, budget * GB, sequences * setup.train.seq, 0.5)
        st.metric(
            "min FSDP degree",
            result["fsdp"],
            f"power of two: {result['fsdp_power_of_two']}",
            delta_color="off",
            delta_arrow="off",
        )
        st.latex(r"N_{FSDP} \ge " + result["latex"])
    except ValueError as err:
        st.error(str(err), icon="⚠️")
    st.subheader("Batch to be compute-bound (Scaling Book ch. 5)")
    report = _bounds(
        setup.model,
        setup.train.precision,
        setup.hardware.name,
        setup.parallel.fsdp,
        setup.parallel.tp,
        setup.parallel.overlap,
    )
    st.latex(r"B^* = " + report["latex"]["critical_batch_tokens"])
    tokens = report["critical_batch_tokens"]
    if tokens is None:
        st.warning("Tensor parallelism alone is communication-bound at this degree.")
    else:
        per_device = report["critical_batch_tokens_per_device"]
        st.metric(
            "critical batch (tokens per step)",
            f"{tokens:,.0f}",
            f"{per_device:,.0f} per device; now {setup.train.batch * setup.train.seq:,}",
            delta_color="off",
            delta_arrow="off",
        )
    st.caption(
        "B* where the FSDP and TP communication time equals the math time (forward "
        "and backward), C the device's peak, W its one-way link bandwidth "
        "(bidirectional ICI on TPUs), as `python -m costmodel bounds`."
    )


@st.cache_data(show_spinner=False, max_entries=256)
def _bounds(model, precision: str, hardware: str, fsdp: int, tp: int, overlap: str) -> dict:
    hw = get_hardware(hardware)
    return bounds_report(
        model,
        fsdp=fsdp,
        tp=tp,
        peak_flops=hw.peak(PRECISIONS[precision].peak_dtype),
        bandwidth=hw.link_bw_bidir if hw.kind == "tpu" else hw.link_bw,
        mx=1,
        my=1,
        overlap=overlap,
        forward_only=False,
    )


def _export(v: dict[str, float]) -> None:
    st.download_button(
        "estimate.json", json.dumps(v, indent=2), "estimate.json", "application/json"
    )
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["quantity", "value"])
    writer.writerows(v.items())
    st.download_button("estimate.csv", buf.getvalue(), "estimate.csv", "text/csv")


def results_page() -> None:
    st.title("Predicted vs measured (validate.run)")
    if "results_dir" not in st.session_state:
        st.session_state["results_dir"] = "validate-results"
    folder = st.text_input("results folder", key="results_dir")
    path = Path(folder) / "results.jsonl"
    if not path.exists():
        st.info(f"No {path} yet: run `python -m validate.run --quick --out {folder}`.")
        return
    from validate.report import summary
    from validate.results import read_rows

    rows = read_rows(folder)
    ok = [r for r in rows if r["status"] == "ok" and r["predicted"] and r["measured"]]
    st.metric(
        "rows",
        len(rows),
        f"{len(rows) - len(ok)} not compared",
        delta_color="off",
        delta_arrow="off",
    )
    quantities = sorted({r["quantity"] for r in ok})
    chosen = st.multiselect(
        "quantities", quantities, default=[q for q in quantities if q.startswith("time_s")][:4]
    )
    data = [
        {k: r[k] for k in ("case", "quantity", "predicted", "measured", "rel_err")}
        for r in ok
        if r["quantity"] in chosen
    ]
    log = alt.Scale(type="log")
    st.altair_chart(
        alt.Chart(alt.Data(values=data), title="predicted vs measured")
        .mark_point()
        .encode(
            alt.X("measured:Q", scale=log),
            alt.Y("predicted:Q", scale=log),
            alt.Color("quantity:N"),
            tooltip=["case:N", "quantity:N", "rel_err:Q"],
        ),
        width="stretch",
    )
    st.dataframe(summary(rows), hide_index=True)
