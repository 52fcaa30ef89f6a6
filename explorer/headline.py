"""The Estimate page's first answer: the verdict by the one fit rule, the setup it assumed
beside it, and for a layout that does not fit the nearest change that does, one click away.

What it says is :func:`costmodel.engine.verdict.verdict`, the answer ``estimate`` prints and
``--json`` and the Export tab give: the fit sentence, what limits the step, the caveats and
the nearest change that fits (recompute, a smaller micro-batch, sharding over every
data-parallel rank, else the planner's layout at the same batch), whose button sets the
inputs it names.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import streamlit as st

from costmodel.engine.caveats import calibration_line
from costmodel.engine.fit import Fit, judge
from costmodel.engine.notes import seq_note
from costmodel.engine.verdict import assumptions, peak_named, verdict
from costmodel.inputs import Setup
from costmodel.units import GIB, fmt_count
from explorer.labels import in_words


def setup_line(setup: Setup, defaulted: Collection[str] = ()) -> str:
    """What the verdict assumed, in one line: the model and devices, then the CLI's
    assumptions line (:func:`costmodel.engine.verdict.assumptions`, the same function, so
    the two cannot drift) as a page says it; ``defaulted``: the inputs the user left as the
    app starts them (:func:`explorer.state.defaulted`), whose defaults it names as such
    (DeepSpeed's ZeRO stage, the framework, the fp8 recipe)."""
    assert setup.parallel is not None and setup.hardware is not None
    said = in_words(assumptions(setup.estimate(), defaulted))
    return f"**{setup.model.name}** · {setup.parallel.devices} × {setup.hardware.name}: {said}"


def _metrics(setup: Setup, v: dict[str, float], fit: Fit) -> None:
    assert setup.hardware is not None
    cols = st.columns(6)
    off = {"delta_color": "off", "delta_arrow": "off"}
    cols[0].metric("parameters", fmt_count(v["params.total"]).split(" (")[-1].rstrip(")"))
    cols[1].metric("memory per device (GiB)", f"{fit.peak_bytes / GIB:,.2f}",
                   f"budget {fit.budget_bytes / GIB:,.1f} GiB ({fit.headroom:g} of "
                   f"{fit.capacity()})", **off)  # fmt: skip
    if not fit.fits:  # a layout that cannot run has no speed, utilisation, duration or cost
        for col, name in zip(cols[2:], ("step time (s)", "tokens/s", "MFU"), strict=False):
            col.metric(name, "–", "does not fit", **off)
        cols[5].metric("days to train", "–", "does not fit", **off)
        return
    cols[2].metric("step time (s)", f"{v['time_s.step']:.4g}")
    n = setup.parallel.devices  # the CLI's per-device figure beside the total
    per = ("one device" if n == 1 else f"all {n:,} devices; "
           f"{v['tokens_per_s'] / n:,.0f} per device")  # fmt: skip
    cols[3].metric("tokens/s", f"{v['tokens_per_s']:,.0f}", per, **off)
    named, _ = peak_named(setup.train, setup.hardware)
    cols[4].metric("MFU", f"{100 * v['mfu']:.1f} %", f"of {named}", **off,
                   help="model FLOPs utilisation: the useful FLOPs a step needs (no "
                   "recomputation: flops.conventions.useful) over a step at peak")  # fmt: skip
    if "train_days" in v:
        cost = f"${v['train_cost']:,.0f}" if "train_cost" in v else "set a price"
        cols[5].metric("days to train", f"{v['train_days']:,.2f}", cost, **off)
    else:
        cols[5].metric("days to train", "–", "set a token budget", **off)


def answer_of(setup: Setup, planner: bool = False) -> dict[str, Any]:
    """The CLI's verdict on the setup (``estimate --json``'s ``"verdict"``); its nearest
    fit without the planner's search unless asked (a click: a search of new layouts takes
    seconds to a minute the first time)."""
    return verdict(setup.estimate(), notes=setup.notes, planner=planner)


answer = st.cache_data(show_spinner=False, max_entries=64)(answer_of)


def headline(
    setup: Setup, v: dict[str, float], stale: bool = False, defaulted: Collection[str] = ()
) -> None:
    """Metrics, then the verdict with the setup it assumed beside it (``defaulted``: the
    inputs left as the app starts them, :func:`setup_line`)."""
    assert setup.parallel is not None and setup.hardware is not None
    fit = judge(v, setup.hardware)
    _metrics(setup, v, fit)
    where = f"on {setup.parallel.devices} × {setup.hardware.name} (dp={setup.parallel.dp})"
    said = fit.sentence(warn=False).split(": ", 1)[1]
    verdict_col, assumed = st.columns([3, 2])
    assumed.markdown(f"Assumed: {setup_line(setup, defaulted)}")
    seq = seq_note({}, setup.model, setup.train, None) if "seq" in defaulted else ()
    for note in (*seq, *setup.notes):  # the CLI's default seq note too (a probe)
        assumed.caption(in_words(note))  # widgets' names, not the CLI's flags
    if stale:  # no green "Fits" for inputs that are not the current ones
        verdict_col.info(f"Last valid inputs: {fit.peak_bytes / GIB:,.2f} GiB per device {where}.")
        return
    said_of = current_answer(setup)
    if fit.tight:  # the CLI's "fits, but TIGHT", its sentence whole
        verdict_col.warning(f"Fits, but TIGHT: {fit.sentence().split(': ', 1)[1]} (per device, "
                            f"{where}).")  # fmt: skip
    elif fit.fits and fit.reserve_warning():  # one amber verdict, not green beside amber
        verdict_col.warning(f"Fits, with little margin: {said} (per device, {where}). The "
                            f"{fit.reserve_warning()}.")  # fmt: skip
    elif fit.fits:
        verdict_col.success(f"Fits: {said} (per device, {where}).")
    else:
        verdict_col.error(f"Does not fit: {said} (per device, {where}).")
        with verdict_col:
            _nearest(said_of.get("nearest_fit") or _planned(setup))
    if "limited_by" in said_of:
        st.markdown(f"**Limited by** {said_of['limited_by']}.")
    for text in said_of["caveats"]:
        st.warning(text)
    st.caption(f"Layout: {said_of['layout']}")
    st.caption(f"Calibration: {calibration_line(setup.hardware, pointer=False)}.")


PLANNER_KEY = "search_nearest"
"""Session key: the setups whose nearest fit the planner was asked to search."""


def current_answer(setup: Setup) -> dict[str, Any]:
    """The verdict as the page shows it: with the planner's nearest fit once asked."""
    return answer(setup, planner=repr(setup) in st.session_state.get(PLANNER_KEY, ()))


def _planned(setup: Setup) -> dict[str, Any] | None:
    """The planner's nearest fit, once asked by the button (``estimate`` asks it always)."""
    asked = st.session_state.setdefault(PLANNER_KEY, set())
    key = repr(setup)
    if key not in asked:
        st.caption("No change of recompute, micro-batch or sharding fits on these devices.")
        st.button("Search every layout at this batch (the planner: these devices, then 2, "
                  "4 and 8 times them)", key="search_planner", on_click=asked.add,
                  args=(key,))  # fmt: skip
        return None
    with st.spinner("searching the layouts that fit"):
        found = current_answer(setup).get("nearest_fit")
    if found is None:
        st.caption("Nothing fits at this batch on these devices or up to 8 times them, with "
                   "any layout, recompute or micro-batch.")  # fmt: skip
    return found


def _nearest(near: dict[str, Any] | None) -> None:
    """The nearest change that fits, with a button that makes it."""
    if near is None:
        return
    tight = (
        f", reserved {near['reserved_bytes'] / GIB:,.1f} GiB (TIGHT: over the device's memory)"
    ) * near["tight"]
    peak = f"peak {near['peak_bytes'] / GIB:,.1f} GiB{tight}"
    st.markdown(f"Nearest change that fits: {near['change']}: {peak}, step {near['step_s']:.3g} s.")
    st.button("Apply the nearest change that fits", key="apply_nearest", type="primary",
              on_click=_set, args=(widget_values(near["inputs"]),))  # fmt: skip


def widget_values(changes: dict[str, Any]) -> dict[str, Any]:
    """Sidebar values that make a :func:`nearest_fit` change: dp is left to fill the
    devices; a micro-batch given replaces the accumulation count."""
    out = {k: x for k, x in changes.items() if k != "dp"}
    if "microbatch" in out:
        out["grad_accum"] = None
    return out


def _set(values: dict[str, Any]) -> None:
    for key, value in values.items():
        st.session_state[key] = value
