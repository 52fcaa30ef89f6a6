"""Two pages: Offload (training larger than device memory by streaming from the host) and
Padding (what each way of batching variable-length sequences wastes). Both call the same
functions as ``python -m costmodel offload`` and ``padding``; bad input is a message."""

from __future__ import annotations

from typing import Any

import altair as alt
import numpy as np
import streamlit as st

from costmodel.catalog.hardware import device_choices, get_hardware
from costmodel.catalog.lengths import SYNTHETIC, read_lengths, synthetic_lengths
from costmodel.engine.offload import LINKS, OffloadConfig, OffloadSpec, explain, plan_offload
from costmodel.engine.padding import (
    LONGEST_DRAWN,
    judged,
    row_coefficients,
    strategy_costs,
    truncated,
)
from costmodel.engine.verdict import sharding
from costmodel.inputs import BY_KEY, build
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.parallel import FRAMEWORKS
from explorer.labels import in_words
from explorer.page_state import PageInput, finish, start, warn_unused
from explorer.state import choices

GB = 1e9


PRECISIONS = BY_KEY["precision"].choices or ()


def _model_inputs(seq: int, batch: int, precision: str) -> tuple[PageInput, ...]:
    """The inputs both pages share with the Estimate page, with this page's starts."""
    return (PageInput("model", str, "llama3-8b", choices("model")),
            PageInput("hardware", str, "h100-sxm", device_choices()),
            PageInput("seq", int, seq), PageInput("batch", int, batch),
            PageInput("precision", str, precision, PRECISIONS))  # fmt: skip


DEVICE_LINK = "device"
"""The offload page's default host link: the device's own (``Hardware.host_link``), as the
CLI's ``offload`` without ``--link``."""
OFFLOAD = (*_model_inputs(8192, 68, "bf16"),
           PageInput("device_gb", float, 30.0, lo=0.1, hi=1e5),
           PageInput("host_gb", float, 70.0, lo=0.1, hi=1e6),
           PageInput("link", str, DEVICE_LINK, (DEVICE_LINK, *LINKS)),
           PageInput("overlap", float, 1.0, lo=0.0, hi=1.0),
           PageInput("optimizer_state", str, "nvme", ("host", "nvme")),
           PageInput("nvme_gbs", float, 6.0, lo=0.1, hi=1e3))  # fmt: skip
SHARDINGS = ("every GPU", "none (DDP replicas)")
"""The Padding page's sharding: FSDP over every GPU, or none (said beside the GPUs: the
CLI's padding shards only with --fsdp, and a probe read opposite verdicts)."""
PADDING = (*_model_inputs(4096, 32, "bf16-mixed"), PageInput("gpus", int, 8, hi=2**16),
           PageInput("sharding", str, "every GPU", SHARDINGS),
           PageInput("framework", str, BY_KEY["framework"].default, FRAMEWORKS),
           PageInput("distribution", str, "lognormal:median=721,sigma=0.85"))  # fmt: skip


def _model_row(page: str) -> None:
    c = st.columns(5)
    c[0].selectbox("model", choices("model"), key=f"{page}_model")
    c[1].selectbox("device", device_choices(), key=f"{page}_hardware")
    c[2].number_input("sequence length", 1, 2**24, key=f"{page}_seq")
    c[3].number_input("batch (sequences per step)", 1, 2**24, key=f"{page}_batch")
    c[4].selectbox("precision", PRECISIONS, key=f"{page}_precision")


def _offload_inputs() -> tuple[dict[str, Any], OffloadSpec]:
    warn_unused(start("offload", OFFLOAD))
    with st.form("offload_inputs"):
        _model_row("offload")
        c = st.columns(6)
        c[0].number_input("device budget (GB)", 0.1, 1e5, key="offload_device_gb")
        c[1].number_input("host budget (GB)", 0.1, 1e6, key="offload_host_gb")
        c[2].selectbox("host link", (DEVICE_LINK, *LINKS), key="offload_link", help="; ".join(
            [f"{DEVICE_LINK}: the device's own host link (its datasheet)"] +
            [f"{k}: {v[1]}" for k, v in LINKS.items()]))  # fmt: skip
        c[3].slider("overlap", 0.0, 1.0, step=0.05, key="offload_overlap")
        c[4].selectbox("optimizer state", ("host", "nvme"), key="offload_optimizer_state")
        c[5].number_input("NVMe GB/s", 0.1, 1e3, key="offload_nvme_gbs")
        st.form_submit_button("Plan", type="primary")
    v = finish("offload", OFFLOAD)
    link = get_hardware(v["hardware"]).host_link if v["link"] == DEVICE_LINK else v["link"]
    spec = OffloadSpec(device_budget=v["device_gb"] * GB, host_budget=v["host_gb"] * GB,
                       link_bw=LINKS[link][0], overlap=v["overlap"],
                       optimizer_state=v["optimizer_state"],
                       nvme_bw=v["nvme_gbs"] * GB)  # fmt: skip
    return v, spec


COLUMNS = {
    "chunk": "chunk (tokens)", "chunks_per_round": "chunks per round",
    "seqs_per_round": "sequences per round", "tokens_per_round": "tokens per round",
    "rounds": "rounds", "pinned_params": "blocks' weights kept on device",
    "param_slots": "weight blocks on device (kept + in flight)",
    "pinned_grads": "blocks' gradients kept on device",
    "grad_slots": "gradient blocks on device (kept + in flight)",
    "device_units": "activation units on device", "full": "host units: saved whole",
    "attn": "host units: input + context + attention", "ctx": "host units: input + context",
}  # fmt: skip
"""The offload planner's decisions in words (``OffloadConfig.decisions`` and
``host_units``), as the table's columns."""


def _bars(parts: dict[str, dict[str, float]], unit: str, title: str,
          stacked: bool = True) -> alt.Chart:  # fmt: skip
    """One bar per group: its parts stacked (they add up), or side by side where they run
    at the same time (``stacked`` False). Twenty colours and a legend below in columns, so
    that a dozen parts keep their own colour and name."""
    rows = [
        {"group": g, "part": k.replace("_", " "), unit: v}
        for g, d in parts.items()
        for k, v in d.items()
        if v
    ]  # a legend of drawn parts
    colour = alt.Color("part:N", title=None, scale=alt.Scale(scheme="category20"),
                       legend=alt.Legend(orient="bottom", columns=3, labelLimit=320))  # fmt: skip
    side = {} if stacked else {"yOffset": alt.YOffset("part:N")}
    return alt.Chart(alt.Data(values=rows), title=title).mark_bar().encode(
        x=alt.X(f"{unit}:Q", stack="zero" if stacked else None), y=alt.Y("group:N", title=None),
        color=colour, tooltip=["group:N", "part:N", f"{unit}:Q"], **side)  # fmt: skip


def _offload_charts(best: OffloadConfig) -> None:
    t = best.time_s
    phases = {p: {"compute": t[f"{p}_compute"], "host->device": t[f"{p}_h2d"],
                  "device->host": t[f"{p}_d2h"]} for p in ("forward", "backward")}  # fmt: skip
    title = ("Each phase: compute and the link's two directions, side by side (they run at "
             "once: a round takes about the longest)")  # fmt: skip
    st.vega_lite_chart(_bars(phases, "seconds per round", title, stacked=False)
                       .to_dict(validate=False), width="stretch")  # fmt: skip
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
        st.error(f"No plan: {in_words(err.message)}")
        return
    st.markdown("\n".join(f"- {line}" for line in explain(configs[0], spec)))
    rows = [{"step (s)": round(c.time_s["step"], 2), "tokens/s": round(c.tokens_per_s),
             **{COLUMNS[k]: v for k, v in (*c.decisions.items(), *c.host_units.items())}}
            for c in configs]  # fmt: skip
    st.dataframe(rows, hide_index=True, width="stretch")
    _offload_charts(configs[0])


def _padding_inputs() -> tuple[dict[str, Any], str, Any]:
    warn_unused(start("padding", PADDING))
    with st.form("padding_inputs"):
        _model_row("padding")
        c = st.columns([1, 1, 1, 3, 2])
        c[0].number_input("GPUs", 1, 2**16, key="padding_gpus")
        c[1].selectbox("sharding", SHARDINGS, key="padding_sharding",
                       help="every GPU: the CLI's --fsdp GPUS (Megatron: its distributed "
                       "optimizer over the replicas); none: DDP replicas, the CLI's "
                       "padding without --fsdp")  # fmt: skip
        c[2].selectbox(
            "framework",
            FRAMEWORKS,
            key="padding_framework",
            help="the trainer the speeds are priced under (the Estimate page's)",
        )
        c[3].text_input("distribution", key="padding_distribution",
                        help=f"{', '.join(SYNTHETIC)} (name:key=value,...)")  # fmt: skip
        upload = c[4].file_uploader("or a lengths file (.txt: lengths or 'length count')")
        st.form_submit_button("Compare", type="primary")
    v = finish("padding", PADDING)
    dist = v.pop("distribution")
    sharded = v.pop("sharding") == SHARDINGS[0]
    sharded = sharded and not trait(v["framework"], "distributed_optimizer")
    return {**v, **({"fsdp": v["gpus"]} if sharded else {})}, dist, upload


def _lengths(dist: str, upload: Any, seq: int) -> np.ndarray:
    if upload is None:  # drawn as the CLI draws them (its --samples and --seed defaults)
        return synthetic_lengths(dist, 100_000, LONGEST_DRAWN, 0)
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
        st.error(in_words(err.message))
        return
    fit = judged(rows, setup)  # the CLI's rule: no speed for a layout that cannot run
    layout = f"{setup.parallel.framework}, {sharding(setup.parallel)}"  # said: the CLI's
    if fit is not None and not fit.fits:  # padding shards only with --fsdp
        st.error(f"Does not fit ({layout}): {fit.sentence()[len('does not fit: '):]}. No "
                 "speed for it: "
                 "the Estimate page names the nearest layout that fits; the padding shares "
                 "below stand.")  # fmt: skip
    elif fit is not None:  # the verdict first, as the CLI's
        said = fit.sentence()
        st.success(f"{said[0].upper()}{said[1:]} ({layout})")
    st.caption(f"{len(lengths):,} documents, mean {lengths.mean():,.1f} tokens; rows of "
               f"{setup.train.seq:,} tokens, {setup.train.batch} rows per step")  # fmt: skip
    cut = truncated(lengths, setup.train.seq)
    if cut["documents"]:  # as the CLI notes it
        st.caption(f"{cut['documents']:,} documents ({cut['documents'] / len(lengths):.1%}) are "
                   f"longer than a row: each is cut at {setup.train.seq:,} tokens, dropping "
                   f"{cut['tokens_fraction']:.1%} of the tokens (a longer sequence keeps "
                   "them)")  # fmt: skip
    table = [{"strategy": k, "rows": r["rows"], "pad tokens (%)": round(100 * r["pad_fraction"], 2),
              "wasted FLOPs (%)": round(100 * r["wasted_flops_fraction"], 2),
              "tokens/s": None if r["tokens_per_s"] is None else round(r["tokens_per_s"])}
             for k, r in rows.items()]  # fmt: skip
    st.dataframe(table, hide_index=True, width="stretch")
    timed = any(r["tokens/s"] is not None for r in table)  # none where it does not fit
    speed = "tokens/s" if timed else "pad tokens (%)"
    tips = ["strategy:N", "tokens/s:Q", "pad tokens (%):Q", "wasted FLOPs (%):Q"]
    title = "Useful tokens per second" if timed else "Padding tokens (no speed: it does not fit)"
    chart = alt.Chart(alt.Data(values=table), title=title).mark_bar()
    chart = chart.encode(x=f"{speed}:Q", y=alt.Y("strategy:N", sort=None), tooltip=tips)
    st.vega_lite_chart(chart.to_dict(validate=False), width="stretch")
    hist = np.histogram(np.minimum(lengths, setup.train.seq), bins=64)
    bins = [{"from": float(lo), "to": float(hi), "documents": int(n)}
            for lo, hi, n in zip(hist[1][:-1], hist[1][1:], hist[0], strict=True)]  # fmt: skip
    lens = alt.Chart(alt.Data(values=bins), title="Document lengths").mark_bar().encode(
        x=alt.X("from:Q", bin="binned", title="tokens"), x2="to:Q", y="documents:Q")  # fmt: skip
    st.vega_lite_chart(lens.to_dict(validate=False), width="stretch")
