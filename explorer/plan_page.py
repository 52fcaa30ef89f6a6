"""The Plan page: a model, a cluster, a batch; every layout searched, the fastest that fit
ranked with what limits each, memory vs time of all of them, and one layout's timeline."""

from __future__ import annotations

from typing import Any

import streamlit as st

from costmodel.catalog.hardware import device_choices, get_hardware
from costmodel.catalog.presets import get_model
from costmodel.engine.caveats import plan_caveats
from costmodel.engine.estimate import estimate
from costmodel.engine.fit import DEFAULT_HEADROOM
from costmodel.engine.layouts import MAX_GPUS, device_counts
from costmodel.engine.plan import (
    FRAMEWORK_CHOICES,
    Plan,
    PlanOptions,
    layout_label,
    nearest_words,
    plan,
    ranking_text,
)
from costmodel.engine.sizing import ASSUMPTIONS, choose, sizes, train_days
from costmodel.engine.timeline import segments
from costmodel.engine.why import change_words, differences, nearest_fitting
from costmodel.inputs import BY_KEY
from costmodel.specs.checks import SpecError
from costmodel.specs.model import TrainSpec
from costmodel.units import GIB, fmt_count
from explorer import plan_charts
from explorer.labels import in_words
from explorer.page_state import PageInput, finish, start, warn_unused
from explorer.state import choices

RECOMPUTE = ("none", "selective", "selective-op", "full")
PRECISIONS = BY_KEY["precision"].choices or ()
INPUTS = (
    PageInput("model", str, "llama3-8b", choices("model")),
    PageInput("hardware", str, "h100-sxm", device_choices()),
    PageInput("gpus", int, 64, hi=2**20),
    PageInput("seq", int, 8192),
    PageInput("batch", int, 256),
    PageInput("precision", str, "bf16-mixed", PRECISIONS),
    PageInput("frameworks", list, ["fsdp2", "megatron"], FRAMEWORK_CHOICES),
    PageInput("recompute", list, list(RECOMPUTE), RECOMPUTE),
    PageInput("headroom", float, DEFAULT_HEADROOM, lo=0.5, hi=1.0),
    PageInput("top", int, 10, hi=100),
    PageInput("count", str, "exactly", ("exactly", "up to")),
    PageInput("tokens", float, 0.0, lo=0, hi=1e16),
    PageInput("price", float, 0.0, lo=0, hi=1e4),
    PageInput("deadline", float, 0.0, lo=0, hi=1e5),
    PageInput("compare", list, [], device_choices()),
)
"""The search's inputs: their URL parameters, starts and ranges (``explorer.page_state``)."""


def _inputs() -> dict[str, Any]:
    """The search's inputs, in a form (the search runs when it is submitted)."""
    problems = start("plan", INPUTS)
    warn_unused(problems)
    with st.form("plan_inputs"):
        c = st.columns(6)
        c[0].selectbox("model", choices("model"), key="plan_model")
        c[1].selectbox("device", device_choices(), key="plan_hardware")
        c[2].number_input("GPUs", min_value=1, max_value=2**20, step=1, key="plan_gpus")
        c[3].number_input("sequence length", min_value=1, max_value=2**24, key="plan_seq")
        c[4].number_input("global batch (sequences)", min_value=1, max_value=2**24,
                          key="plan_batch")  # fmt: skip
        c[5].selectbox("precision", PRECISIONS, key="plan_precision")
        c = st.columns([2, 3, 1, 1])
        c[0].multiselect("frameworks", FRAMEWORK_CHOICES, key="plan_frameworks")
        c[1].multiselect("recompute policies", RECOMPUTE, key="plan_recompute")
        c[2].slider("memory headroom", 0.5, 1.0, step=0.01, key="plan_headroom",
                    help="a layout fits when its peak allocated bytes are at most this share "
                    "of device memory (the rule estimate and solve use too)")  # fmt: skip
        c[3].number_input("top", min_value=1, max_value=100, key="plan_top")
        c = st.columns(4)
        c[0].radio("GPU count", ("exactly", "up to"), key="plan_count", horizontal=True,
                   help="up to: every count up to the GPUs (whole nodes whose count has no "
                   "prime factor above 5), each with its fastest layout; at most "
                   f"{MAX_GPUS:,}")  # fmt: skip
        c[1].number_input("tokens to train on (0: no sizing)", min_value=0.0, max_value=1e16,
                          format="%.4g", key="plan_tokens")  # fmt: skip
        c[2].number_input("price per GPU-hour (0: none)", min_value=0.0, max_value=1e4,
                          key="plan_price")  # fmt: skip
        c[3].number_input("deadline in days (0: none)", min_value=0.0, max_value=1e5,
                          key="plan_deadline")  # fmt: skip
        st.multiselect("compare with other devices (each searched alike; its best layout)",
                       device_choices(), key="plan_compare")  # fmt: skip
        st.form_submit_button("Search", type="primary")
    inp = finish("plan", INPUTS)
    return {**inp, "frameworks": tuple(inp["frameworks"]), "recompute": tuple(inp["recompute"]),
            "headroom": float(inp["headroom"]), "compare": tuple(inp["compare"])}  # fmt: skip


def _search(inp: dict[str, Any]) -> Plan:
    """The plan of ``inp`` on its device kind."""
    return _plan_of(inp, inp["hardware"])


def _plan_of(inp: dict[str, Any], hardware: str) -> Plan:
    """The search of ``inp`` on one device kind (its own node size under "up to")."""
    train = TrainSpec(batch=inp["batch"], seq=inp["seq"], precision=inp["precision"])
    options = PlanOptions(frameworks=inp["frameworks"], recompute=inp["recompute"],
                          memory_headroom=inp["headroom"])  # fmt: skip
    hw = get_hardware(hardware)
    counts = inp["gpus"]
    if inp["count"] == "up to":
        counts = device_counts(inp["gpus"], hw.devices_per_node)
    return plan(get_model(inp["model"]), train, hw, counts, options)


@st.cache_data(show_spinner=False, max_entries=64)
def _best_on(inp: dict[str, Any], hardware: str) -> dict[str, Any] | str:
    """A device kind's best layout as a row, or why it has none (kept small for the cache)."""
    try:
        p = _plan_of(inp, hardware)
    except SpecError as err:
        return err.message
    return p.row(int(p.order[0])) if len(p.order) else "no layout fits"


def compared_rows(inp: dict[str, Any], p: Plan) -> list[dict[str, Any]]:
    """The page's device and each compared one: its best layout, fastest first (tokens/s:
    prices differ per kind, so cost across kinds is the CLI's, with one price each)."""
    kinds = dict.fromkeys((inp["hardware"], *inp["compare"]))
    rows, none = [], []
    for kind in kinds:
        best = p.row(int(p.order[0])) if kind == inp["hardware"] and len(p.order) else None
        best = best or _best_on({k: v for k, v in inp.items() if k != "compare"}, kind)
        if isinstance(best, str):
            none.append({"device": kind, "layout": best})
            continue
        row = {"device": kind, "GPUs": best["gpus"], "layout": layout_label(best),
               "tokens/s": round(best["tokens_per_s"]),
               "tokens/s per GPU": round(best["tokens_per_s"] / best["gpus"]),
               "MFU (%)": round(100 * best["mfu"], 1),
               "peak (GiB)": round(best["memory_bytes_per_device.peak"] / GIB, 1)}  # fmt: skip
        if inp["tokens"] > 0:
            row["days"] = round(train_days(inp["tokens"], best["tokens_per_s"]), 1)
        rows.append(row)
    return sorted(rows, key=lambda r: -r["tokens/s"]) + none


def shown(p: Plan, top: int) -> list[int]:
    """The planner's top layouts in its own order (the CLI's and the API's row numbers: a
    probe found the page's fastest-first numbers pointing at other layouts than theirs)."""
    return p.order[:top].tolist()


def table_rows(p: Plan, top: int, model: str) -> list[dict[str, Any]]:
    """One row per shown layout, with what the tie rule reads (step vs the fastest, the
    model-parallel GPUs) so the order and the recommendation can be checked by eye; the
    numbers first, the long words (what limits it, how it differs) last, so a 1,600 px
    screen shows the numbers without scrolling."""
    rows, pick = [], int(p.order[0])
    idx = shown(p, top)
    fastest = min(p.values["time_s.step"][i] for i in idx)
    best = p.row(pick)
    for n, i in enumerate(idx, 1):
        r = p.row(i)
        changed = differences(r, best)["changed"]
        rows.append({"#": n, "recommended": "✓" if i == pick else "",
                     "estimate": plan_charts.estimate_link(p, i, model),
                     "layout": layout_label(r), "step (s)": round(r["time_s.step"], 4),
                     "tokens/s per GPU": round(r["tokens_per_s"] / r["gpus"]),
                     "MFU (%)": round(100 * r["mfu"], 1),
                     "peak (GiB)": round(r["memory_bytes_per_device.peak"] / GIB, 1),
                     "reserved (GiB)": round(r["memory_bytes_per_device.reserved"] / GIB, 1),
                     "margin": _margin(r, p),
                     "vs fastest (%)": round(100 * (r["time_s.step"] / fastest - 1), 2),
                     "model-parallel GPUs": int(r["tp"] * r["pp"] * r["cp"]),
                     "limited by": r["limit"],
                     "differs from ✓": change_words(changed, "→")})  # fmt: skip
    return rows


def _margin(row: dict[str, Any], p: Plan) -> str:
    """The Estimate page's word for a row's allocator reserve: TIGHT over the device's
    memory, little over the fit rule's budget, else nothing to say."""
    reserved = row["memory_bytes_per_device.reserved"]
    if reserved > p.hardware.hbm_bytes:
        return "TIGHT"
    return "little" if reserved > p.budget_bytes else ""


def _table(p: Plan, top: int, model: str) -> None:
    config = {
        "estimate": st.column_config.LinkColumn("estimate", display_text="open"),
        "tokens/s per GPU": st.column_config.NumberColumn(format="localized"),
    }
    st.dataframe(table_rows(p, top, model), hide_index=True, column_config=config,
                 width="stretch")  # fmt: skip
    if p.options.memory_headroom != DEFAULT_HEADROOM:  # a row can fit here and not there
        st.caption(f"The rows fit {p.options.memory_headroom:g} of the device's memory; the "
                   f"Estimate page a row opens judges at its own {DEFAULT_HEADROOM:g} "
                   "(the CLI's estimate --memory-headroom sets it).")  # fmt: skip
    tight = [i for i in p.order[:top] if p.values["memory_bytes_per_device.reserved"][i]
             > p.hardware.hbm_bytes]  # fmt: skip
    if tight:
        st.warning(f"{len(tight)} of these rows are TIGHT: the allocator would reserve more "
                   "than the device holds (retries that free cached blocks, a risk of "
                   "running out); a lower headroom keeps rows that leave it room.")  # fmt: skip


def _timeline(p: Plan, top: int) -> None:
    idx = shown(p, top)
    labels = [f"#{k} {layout_label(p.row(i))}" for k, i in enumerate(idx, 1)]
    pick = st.selectbox("timeline of", labels, index=idx.index(int(p.order[0])))
    i = idx[labels.index(pick)]
    par = p.parallel_spec(i)
    values = estimate(p.model, p.train_spec(i), par, p.hardware).values
    segs = segments({k: float(v) for k, v in values.items()}, par)
    st.vega_lite_chart(plan_charts.timeline_chart(segs).to_dict(validate=False), width="stretch")


def plan_page() -> None:
    st.title("Plan: the fastest layout that fits")
    inp = _inputs()
    if not inp["frameworks"] or not inp["recompute"]:
        st.error("Pick at least one framework and one recompute policy.")
        return
    try:
        p = _search(inp)
    except SpecError as err:
        st.error(f"No layout: {in_words(err.message)}")
        return
    _batch_warning(inp)
    fit = int(p.fits.sum())
    rows = (f" Rows as the CLI and the API number them: {ranking_text(p.options.objective)}; "
            "row 1 (✓) is the recommended one." if fit else "")  # fmt: skip
    st.caption(f"{p.enumerated:,} layouts enumerated, {p.valid:,} valid, {fit:,} fit in "
               f"{p.budget_bytes / GIB:,.1f} GiB per device.{rows}")  # fmt: skip
    if not fit:
        best = p.smallest_memory()
        st.warning(
            f"No layout fits: the smallest peak is "
            f"{best['memory_bytes_per_device.peak'] / GIB:,.1f} GiB "
            f"({layout_label(best)}) against {p.budget_bytes / GIB:,.1f} GiB."
        )
        _nearest(p)
    else:
        _table(p, inp["top"], inp["model"])
        for text in plan_caveats(p):  # what plan and estimate caution of the best layout
            st.warning(text)
    if fit and inp["tokens"] > 0:
        _sizing(p, inp)
    if inp["compare"]:
        st.subheader("Devices compared (each one's best layout, fastest first)")
        with st.spinner("searching the other devices"):
            st.dataframe(compared_rows(inp, p), hide_index=True, width="stretch")
    chart = plan_charts.pareto_chart(p, inp["top"])
    st.vega_lite_chart(chart.to_dict(validate=False), width="stretch")
    if fit:
        _timeline(p, inp["top"])


def _batch_warning(inp: dict[str, Any]) -> None:
    """A global batch smaller than the devices: every layout splits each sequence over
    several of them (tp x pp x cp at least GPUs / batch), said with where the batch came
    from; the layouts' own MFU says what that costs (Llama 3 405B's 2,048 sequences on
    16,384 GPUs run well: a fifth probe found the old 'far below peak' false there)."""
    if inp["batch"] >= inp["gpus"]:
        return
    came = st.session_state.get("_plan", {}).get("_from", {}).get("batch") == inp["batch"]
    where = " (taken from the Estimate page)" if came else ""
    split = -(-inp["gpus"] // inp["batch"])
    st.info(f"A global batch of {inp['batch']:,} sequences{where} is fewer than the "
            f"{inp['gpus']:,} GPUs: every layout splits each sequence over {split:,} devices "
            "or more (tp x pp x cp), whose cost the MFU below shows.")  # fmt: skip


def _nearest(p: Plan) -> None:
    """The nearest layout that fits (more devices, or what the options left out)."""
    with st.spinner("searching for the nearest layout that fits"):
        near = _nearest_row(p.model, p.train, p.hardware, _counts(p), p.options)
    words = nearest_words(near)
    st.info(f"{words[:1].upper()}{words[1:]}.")


def _counts(p: Plan) -> tuple[int, ...]:
    return tuple(sorted({int(g) for g in p.columns["gpus"]}))


_nearest_row = st.cache_data(show_spinner=False, max_entries=32)(nearest_fitting)


def _sizing(p: Plan, inp: dict[str, Any]) -> None:
    """Per GPU count its fastest layout's days, GPU-hours and cost on the token budget, the
    answer (the cheapest count within the deadline) and the days-against-cost chart."""
    price, deadline = inp["price"] or None, inp["deadline"] or None
    rows = sizes(p, inp["tokens"], price, deadline)
    st.subheader(f"Sizing: {fmt_count(inp['tokens'])} tokens")
    try:
        best = choose(rows, deadline)
        cost = "" if best.cost is None else f", ${best.cost:,.0f}"
        why = "fastest" if deadline is None else f"cheapest within {deadline:g} days"
        st.success(f"The {why}: {best.gpus:,} GPUs, {best.days:,.1f} days, "
                   f"{best.gpu_hours:,.0f} GPU-hours{cost}.")  # fmt: skip
    except SpecError as err:
        st.warning(in_words(err.message))
    table = [{"GPUs": r.gpus, "days": round(r.days, 2), "GPU-hours": round(r.gpu_hours),
              **({"cost ($)": round(r.cost)} if r.cost is not None else {}),
              "Pareto": "✓" if r.pareto else "",
              **({"within deadline": "✓" if r.meets else ""} if deadline else {}),
              **({"energy (MWh)": round(r.energy_mwh, 1)} if r.energy_mwh is not None else {}),
              "MFU (%)": round(100 * float(p.values["mfu"][r.index]), 1),
              "layout": layout_label(p.row(r.index))} for r in rows]  # fmt: skip
    st.dataframe(table, hide_index=True, width="stretch")
    chart = plan_charts.sizing_chart(rows, deadline)
    st.vega_lite_chart(chart.to_dict(validate=False), width="stretch")
    st.caption("Assumes: " + "; ".join(ASSUMPTIONS) + ".")
