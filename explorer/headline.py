"""The Estimate page's first answer: the verdict by the one fit rule, the setup it assumed
beside it, and for a layout that does not fit the nearest change that does, one click away.

The nearest change is :func:`costmodel.engine.nearest.nearest_fit` (recompute, a smaller
micro-batch, sharding over every data-parallel rank), or when none fits on these devices
:func:`~costmodel.engine.nearest.more_devices`; the button sets the widgets it names.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from costmodel.engine.caveats import caveats
from costmodel.engine.fit import Fit, judge
from costmodel.engine.nearest import micro_per_device, more_devices, nearest_fit
from costmodel.engine.plan import limit_of
from costmodel.engine.verdict import layout_line, peak_named
from costmodel.inputs import Setup
from costmodel.units import GIB, fmt_count


def setup_line(setup: Setup) -> str:
    """What the verdict assumed, in one line: model, framework, degrees, micro-batch x
    accumulation, recompute."""
    par, train = setup.parallel, setup.train
    assert par is not None and setup.hardware is not None
    degrees = f"dp {par.dp} × fsdp {par.fsdp} × tp {par.tp} × pp {par.pp} × cp {par.cp}"
    if par.ep > 1:
        degrees += f" (ep {par.ep})"
    micro = micro_per_device(train, par)
    return (f"**{setup.model.name}** · framework **{par.framework}** · {par.devices} × "
            f"{setup.hardware.name}: {degrees} · micro-batch {micro} per device × "
            f"{train.grad_accum} accumulation steps · recompute {train.recompute} · "
            f"{train.precision}")  # fmt: skip


def _metrics(setup: Setup, v: dict[str, float], fit: Fit) -> None:
    assert setup.hardware is not None
    cols = st.columns(6)
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
        return
    named, _ = peak_named(setup.train, setup.hardware)
    cols[4].metric("MFU", f"{100 * v['mfu']:.1f} %", f"of {named}", **off)
    if "train_days" in v:
        cost = f"${v['train_cost']:,.0f}" if "train_cost" in v else "set a price"
        cols[5].metric("days to train", f"{v['train_days']:,.2f}", cost, **off)
    else:
        cols[5].metric("days to train", "–", "set a token budget", **off)


def headline(setup: Setup, v: dict[str, float], stale: bool = False) -> None:
    """Metrics, then the verdict with the setup it assumed beside it."""
    assert setup.parallel is not None and setup.hardware is not None
    fit = judge(v, setup.hardware)
    _metrics(setup, v, fit)
    where = f"on {setup.parallel.devices} × {setup.hardware.name} (dp={setup.parallel.dp})"
    said = fit.sentence().split(": ", 1)[1]
    verdict, assumed = st.columns([3, 2])
    if stale:  # no green "Fits" for inputs that are not the current ones
        verdict.info(f"Last valid inputs: {fit.peak_bytes / GIB:,.2f} GiB per device {where}.")
    elif fit.fits:
        verdict.success(f"Fits: {said} (per device, {where}).")
    else:
        verdict.error(f"Does not fit: {said} (per device, {where}).")
        with verdict:
            _nearest(setup)
    assumed.markdown(f"Assumed: {setup_line(setup)}")
    for note in setup.notes:
        assumed.caption(note)
    if fit.fits and not stale:  # what the CLI's verdict says beside a fit
        st.markdown(f"**Limited by** {limit_of(v, fit.budget_bytes)}.")
    for text in caveats(setup.estimate()):
        st.warning(text)
    st.caption(f"Layout: {layout_line(setup.train, setup.parallel, setup.hardware)}")


def _nearest(setup: Setup) -> None:
    """The nearest change that fits, with a button that makes it."""
    found = nearest_change(setup)
    if found is None:
        st.caption("No change of recompute, micro-batch or sharding fits, on up to "
                   "1,024-way sharding.")  # fmt: skip
        return
    words, inputs = found
    st.markdown(f"Nearest change that fits: {words}.")
    st.button("Apply the nearest change that fits", key="apply_nearest", type="primary",
              on_click=_set, args=(inputs,))  # fmt: skip


def nearest_answer(setup: Setup) -> tuple[str, dict[str, Any]] | None:
    """(what changes, in words; the sidebar values that make it), or None."""
    est = setup.estimate()
    near = nearest_fit(est)
    if near is not None:
        words = (f"{near['change']}: peak {near['peak_bytes'] / GIB:,.1f} GiB, step "
                 f"{near['step_s']:.3g} s")  # fmt: skip
        return words, widget_values(near["inputs"])
    more = more_devices(est)
    if more is None:
        return None
    inputs = {"gpus": more["devices"], "fsdp": more["fsdp"], "batch": more["batch"],
              "recompute": "full", "microbatch": 1, "grad_accum": None}  # fmt: skip
    words = (
        f"{more['devices']:,} GPUs (fsdp {more['fsdp']}, batch {more['batch']:,}, "
        f"recompute full, micro-batch 1): peak {more['peak_bytes'] / GIB:,.1f} GiB"
    )
    return words, inputs


nearest_change = st.cache_data(show_spinner=False, max_entries=64)(nearest_answer)


def widget_values(changes: dict[str, Any]) -> dict[str, Any]:
    """Sidebar values that make a :func:`nearest_fit` change: dp is left to fill the
    devices; an accumulation count given replaces the micro-batch."""
    out = {k: x for k, x in changes.items() if k != "dp"}
    if "grad_accum" in out:
        out["microbatch"] = None
    return out


def _set(values: dict[str, Any]) -> None:
    for key, value in values.items():
        st.session_state[key] = value
