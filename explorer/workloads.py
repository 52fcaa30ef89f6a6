"""Two pages: Offload (training larger than device memory by streaming from the host) and
Padding (what each way of batching variable-length sequences wastes). Both call the same
functions as ``python -m costmodel offload`` and ``padding``; bad input is a message."""

from __future__ import annotations

from typing import Any

import altair as alt
import numpy as np
import streamlit as st

from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.lengths import SYNTHETIC, read_lengths, synthetic_lengths
from costmodel.engine.offload import LINKS, OffloadConfig, OffloadSpec, explain, plan_offload
from costmodel.engine.padding import row_coefficients, strategy_costs
from costmodel.inputs import BY_KEY, build
from costmodel.specs.checks import SpecError
from explorer.state import choices

GB = 1e9


def _model_row(key: str, seq: int, batch: int, precision: str) -> dict[str, Any]:
    c = st.columns(5)
    model = c[0].selectbox("model", choices("model"), index=choices("model").index("llama3-8b"),
                           key=f"{key}_model")  # fmt: skip
    hardware = c[1].selectbox("device", tuple(HARDWARE), index=tuple(HARDWARE).index("h100-sxm"),
                              key=f"{key}_hw")  # fmt: skip
    seq = c[2].number_input("sequence length", 1, 2**24, seq, key=f"{key}_seq")
    batch = c[3].number_input("batch (sequences per step)", 1, 2**24, batch, key=f"{key}_batch")
    precisions = BY_KEY["precision"].choices or ()
    precision = c[4].selectbox("precision", precisions, index=precisions.index(precision),
                               key=f"{key}_prec")  # fmt: skip
    return {"model": model, "hardware": hardware, "seq": int(seq), "batch": int(batch),
            "precision": precision}  # fmt: skip


def _offload_inputs() -> tuple[dict[str, Any], OffloadSpec]:
    with st.form("offload_inputs"):
        base = _model_row("off", 8192, 68, "bf16")
        c = st.columns(6)
        device = c[0].number_input("device budget (GB)", 0.1, 1e5, 30.0)
        host = c[1].number_input("host budget (GB)", 0.1, 1e6, 70.0)
        link = c[2].selectbox("host link", tuple(LINKS), index=1, help="; ".join(
            f"{k}: {v[1]}" for k, v in LINKS.items()))  # fmt: skip
        overlap = c[3].slider("overlap", 0.0, 1.0, 1.0, 0.05)
        where = c[4].selectbox("optimizer state", ("host", "nvme"), index=1)
        nvme = c[5].number_input("NVMe GB/s", 0.1, 1e3, 6.0)
        st.form_submit_button("Plan", type="primary")
    spec = OffloadSpec(device_budget=device * GB, host_budget=host * GB, link_bw=LINKS[link][0],
                       overlap=overlap, optimizer_state=where, nvme_bw=nvme * GB)  # fmt: skip
    return base, spec


def _bars(parts: dict[str, dict[str, float]], unit: str, title: str) -> alt.Chart:
    rows = [{"group": g, "part": k, unit: v} for g, d in parts.items() for k, v in d.items()]
    return alt.Chart(alt.Data(values=rows), title=title).mark_bar().encode(
        x=alt.X(f"{unit}:Q", stack="zero"), y=alt.Y("group:N", title=None),
        color=alt.Color("part:N"), tooltip=["group:N", "part:N", f"{unit}:Q"])  # fmt: skip


def _offload_charts(best: OffloadConfig) -> None:
    t = best.time_s
    phases = {p: {"compute": t[f"{p}_compute"], "host->device": t[f"{p}_h2d"],
                  "device->host": t[f"{p}_d2h"]} for p in ("forward", "backward")}  # fmt: skip
    st.vega_lite_chart(_bars(phases, "seconds per round", "Each phase: compute vs the link's "
                             "two directions (they overlap)").to_dict(validate=False),
                       width="stretch")  # fmt: skip
    memory = {"device": {k: v / GB for k, v in best.device_bytes.items()},
              "host": {k: v / GB for k, v in best.host_bytes.items()}}  # fmt: skip
    st.vega_lite_chart(_bars(memory, "GB", "Memory of the fastest plan").to_dict(validate=False),
                       width="stretch")  # fmt: skip


def offload_page() -> None:
    st.title("Offload: training larger than device memory")
    base, spec = _offload_inputs()
    try:
        setup = build({k: base[k] for k in ("model", "seq", "batch", "precision")})
        configs = plan_offload(setup.model, setup.train, get_hardware(base["hardware"]), spec)
    except SpecError as err:
        st.error(f"No plan: {err.message}")
        return
    st.markdown("\n".join(f"- {line}" for line in explain(configs[0], spec)))
    rows = [{"step (s)": round(c.time_s["step"], 2), "tokens/s": round(c.tokens_per_s),
             **c.decisions, **{f"host {k}": v for k, v in c.host_units.items()}}
            for c in configs]  # fmt: skip
    st.dataframe(rows, hide_index=True, width="stretch")
    _offload_charts(configs[0])


def _padding_inputs() -> tuple[dict[str, Any], str, Any]:
    with st.form("padding_inputs"):
        base = _model_row("pad", 4096, 32, "bf16-mixed")
        c = st.columns([1, 3, 2])
        gpus = c[0].number_input("GPUs (FSDP)", 1, 2**16, 8)
        dist = c[1].text_input("distribution", "lognormal:median=721,sigma=0.85",
                               help=f"{', '.join(SYNTHETIC)} (name:key=value,...)")  # fmt: skip
        upload = c[2].file_uploader("or a lengths file (.txt: lengths or 'length count')")
        st.form_submit_button("Compare", type="primary")
    return {**base, "gpus": int(gpus), "fsdp": int(gpus)}, dist, upload


def _lengths(dist: str, upload: Any, seq: int) -> np.ndarray:
    if upload is None:
        return synthetic_lengths(dist, 100_000, seq)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(upload.name).name
        path.write_bytes(upload.getvalue())
        return read_lengths(path)


def padding_page() -> None:
    st.title("Padding: what each way of batching wastes")
    values, dist, upload = _padding_inputs()
    try:
        setup = build(values)
        lengths = _lengths(dist, upload, setup.train.seq)
        rows = strategy_costs(lengths, setup.train.seq, setup.train.batch,
                              row_coefficients(setup))  # fmt: skip
    except SpecError as err:
        st.error(err.message)
        return
    st.caption(f"{len(lengths):,} documents, mean {lengths.mean():,.1f} tokens; rows of "
               f"{setup.train.seq:,} tokens, {setup.train.batch} rows per step")  # fmt: skip
    table = [{"strategy": k, "rows": r["rows"], "pad tokens (%)": round(100 * r["pad_fraction"], 2),
              "wasted FLOPs (%)": round(100 * r["wasted_flops_fraction"], 2),
              "tokens/s": round(r["tokens_per_s"])} for k, r in rows.items()]  # fmt: skip
    st.dataframe(table, hide_index=True, width="stretch")
    tips = ["strategy:N", "tokens/s:Q", "pad tokens (%):Q", "wasted FLOPs (%):Q"]
    chart = alt.Chart(alt.Data(values=table), title="Useful tokens per second").mark_bar()
    chart = chart.encode(x="tokens/s:Q", y=alt.Y("strategy:N", sort=None), tooltip=tips)
    st.vega_lite_chart(chart.to_dict(validate=False), width="stretch")
    hist = np.histogram(np.minimum(lengths, setup.train.seq), bins=64)
    bins = [{"from": float(lo), "to": float(hi), "documents": int(n)}
            for lo, hi, n in zip(hist[1][:-1], hist[1][1:], hist[0], strict=True)]  # fmt: skip
    lens = alt.Chart(alt.Data(values=bins), title="Document lengths").mark_bar().encode(
        x=alt.X("from:Q", bin="binned", title="tokens"), x2="to:Q", y="documents:Q")  # fmt: skip
    st.vega_lite_chart(lens.to_dict(validate=False), width="stretch")
