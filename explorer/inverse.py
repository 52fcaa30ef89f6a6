"""The Inverse questions tab: the full model's answer beside the Scaling Book's closed form.

Each question is answered twice, labelled: by the engine (per-device peak and step time of
the full model) and by the book's approximation (``costmodel.book``), with the reason
they differ, so a reader sees which simplification moves the number.
"""

from __future__ import annotations

import streamlit as st

from costmodel.book.bounds import LABEL, bounds_latex, bounds_report
from costmodel.book.fsdp import min_fsdp
from costmodel.engine.fit import budget_bytes
from costmodel.engine.inverse import min_fsdp_fitting
from costmodel.inputs import Setup
from costmodel.specs.checks import SpecError
from costmodel.units import GB, GIB, plural
from explorer import charts
from explorer.labels import in_words

MAX_FSDP = 4096
_WHY_FSDP = (
    "The book counts the training state (weights, master, gradients, optimizer) and the "
    "kept activations, half of them sharded; the full model adds what a device really "
    "holds at its peak: low-precision weight copies, ZeRO-3's gathered layers, the "
    "optimizer's temporaries, logits and backward transients, and divides by tp/pp/cp too."
)
_WHY_BATCH = (
    "The book is an FFN-only model at peak FLOP/s over one link per axis, without the "
    "(N-1)/N ring factor or latency; the full model counts attention and the vocabulary, "
    "achieved (not peak) FLOP/s, α-β collectives on the link each group is placed on, "
    "and the overlap rule per phase. The full model's batch grows with the accumulation "
    "steps held, its micro-batch per device with it: set that micro-batch to reach it (a "
    "larger batch of more accumulation steps gathers the FSDP weights again in each)."
)


def inverse_tab(setup: Setup) -> None:
    assert setup.parallel is not None and setup.hardware is not None
    st.subheader("Smallest FSDP degree that fits")
    budget = st.number_input(
        "memory budget (GB = 1e9 bytes)",
        min_value=0.1,
        value=round(budget_bytes(setup.hardware) / GB, 1),
        help="default: the fit rule's headroom x device memory (on the peak)",
        key="budget_gb",
    )
    full, book = st.columns(2)
    with full:
        st.markdown("**Full model** (per-device peak, this layout's micro-batch)")
        result = _full_min_fsdp(setup, budget * GB)
        if result["fsdp"] is None:
            low = result["per_device_bytes"] / GIB
            st.warning(
                f"No FSDP degree up to {MAX_FSDP:,} fits: at best {low:,.1f} GiB per device."
            )
        else:
            st.metric("min FSDP degree (full model)", result["fsdp"], _held(setup, result),
                      delta_color="off", delta_arrow="off")  # fmt: skip
            if result["reserved_bytes"] > setup.hardware.hbm_bytes:  # the CLI's TIGHT
                safe = result["fsdp_untight"]
                then = (f"the smallest degree whose reserve it holds: {safe}" if safe
                        else "no degree's reserve fits it")  # fmt: skip
                st.warning(f"At fsdp {result['fsdp']} (this answer, not your layout): "
                           f"TIGHT, reserved {result['reserved_bytes'] / GIB:,.1f} GiB is "
                           f"over the device's memory; {then}")  # fmt: skip
    with book:
        st.markdown(f"**{LABEL}**")
        _book_min_fsdp(setup, budget * GB)
        if setup.train.finetune != "full":  # the book's state is full training's
            st.caption(f"Full training's state: the book's form has no {setup.train.finetune} "
                       "(frozen weights without gradients or optimizer state).")  # fmt: skip
        split = setup.parallel.tp * setup.parallel.pp * setup.parallel.cp
        if split > 1:  # not the same question: say so beside the number
            st.caption(f"FSDP alone: the book's form has no tp, pp or cp, which split this "
                       f"layout's model {split} ways before fsdp shards it.")  # fmt: skip
    st.caption(_WHY_FSDP)
    st.subheader("Batch to be compute-bound")
    full, book = st.columns(2)
    with full:
        st.markdown("**Full model** (compute vs communication time, this layout)")
        cross = _full_crossover(setup)
        tokens = f" ({cross * setup.train.seq:,} tokens)" if cross else ""
        shown = (
            f"{plural(cross, 'sequence')}{tokens}" if cross else "not up to 2^15 x the batch step"
        )
        first = setup.parallel.batch_step(setup.train.grad_accum)  # type: ignore[union-attr]
        floor = (f"already at the smallest batch of this layout at grad-accum "
                 f"{setup.train.grad_accum}" if cross == first else
                 charts.held(setup, cross) if cross else None)  # fmt: skip
        st.metric("compute-bound from batch (full model)", shown, floor, delta_color="off",
                  delta_arrow="off")  # fmt: skip
    with book:
        st.markdown(f"**{LABEL}**")
        _book_critical_batch(setup)
    st.caption(_WHY_BATCH)


def _held(setup: Setup, result: dict) -> str:
    """What the answer holds and what it takes: the other degrees and each device's
    micro-batch kept, so the devices and the batch grow with fsdp (the sidebar's GPU count
    would instead take dp down)."""
    par = setup.parallel.replace(fsdp=result["fsdp"])  # type: ignore[union-attr]
    batch = par.batch_step(setup.train.grad_accum) * result["micro_batch_per_device"]
    return (f"on {plural(par.devices, 'GPU')} at batch {batch:,}: dp {par.dp}, tp {par.tp}, pp "
            f"{par.pp}, cp {par.cp} and the micro-batch held")  # fmt: skip


def full_min_fsdp(setup: Setup, budget: float) -> dict:
    """The full model's smallest FSDP degree whose peak fits ``budget`` bytes."""
    assert setup.parallel is not None and setup.hardware is not None
    return min_fsdp_fitting(
        setup.model, setup.train, setup.parallel, setup.hardware, budget, max_fsdp=MAX_FSDP
    )


_full_min_fsdp = st.cache_data(show_spinner=False, max_entries=64)(full_min_fsdp)


@st.cache_data(show_spinner=False, max_entries=64)
def _full_crossover(setup: Setup) -> int | None:
    assert setup.parallel is not None
    step = setup.parallel.batch_step(setup.train.grad_accum)
    return charts.crossover(charts.comm_rows(setup, [step * 2**k for k in range(16)]))


def _book_min_fsdp(setup: Setup, budget: float) -> None:
    sequences = max(1, setup.train.micro_batch // setup.parallel.batch_step(1))  # type: ignore[union-attr]
    try:
        result = min_fsdp(
            setup.model,
            setup.train,
            budget,
            sequences * setup.train.seq,
            0.5,
            setup.parallel.framework,
        )  # type: ignore[union-attr]
    except SpecError as err:  # the closed form has no answer here; not an input's error
        st.info(f"The book's closed form has no answer here: {in_words(err.message)}")
        return
    st.metric(
        "min FSDP degree (book)",
        result["fsdp"],
        f"power of two: {result['fsdp_power_of_two']}",
        delta_color="off",
        delta_arrow="off",
    )
    # the closed form in its named terms: sympy's expansion in every model size overflowed
    # the column (a probe); the terms' values follow it
    st.latex(r"N_{FSDP} \ge \frac{S + f\,A}{M - (1 - f)\,A}")
    st.caption(
        f"S = {_gib(result['state_bytes'])} of training state (weights, gradients, optimizer "
        f"state), A = {_gib(result['activation_bytes'])} of activations a device holds, "
        f"f = {result['sharded_activation_fraction']:g} of them sharded, M = "
        f"{_gib(result['budget_bytes'])}: N >= {result['fsdp_exact']:,.2f}"
    )


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


@st.cache_data(show_spinner=False, max_entries=256)
def _bounds(setup: Setup) -> dict:
    assert setup.parallel is not None and setup.hardware is not None
    return bounds_report(setup.model, setup.parallel, setup.hardware,
                         precision=setup.train.precision, latex=False)  # fmt: skip


@st.cache_data(show_spinner=False, max_entries=64)
def _book_formula(setup: Setup) -> str:
    """B* of this layout in the model's sizes (sympy solves it: only when asked)."""
    assert setup.parallel is not None
    par = setup.parallel
    return bounds_latex(setup.model, par.fsdp, par.tp, False)["critical_batch_tokens"]


def _book_critical_batch(setup: Setup) -> None:
    try:
        report = _bounds(setup)
    except SpecError as err:  # the book's closed forms cover dense FFN stacks only
        st.info(in_words(err.message))
        return
    tokens = report["critical_batch_tokens"]
    if tokens == 0:  # "B* = 0" would read as an answer; there is nothing to hide
        regime = in_words(report["regime"])
        st.info(f"fsdp {report['fsdp']}, tp {report['tp']}: {regime} (the book's model).")
        return
    st.latex(r"B^* = \frac{T_{FSDP}}{(T_{math} - T_{TP})\,/\,B}")
    if st.toggle("B* in the model's sizes", key="book_formula"):
        st.latex(r"B^* = " + _book_formula(setup))
    if tokens is None:
        st.warning(f"fsdp {report['fsdp']}, tp {report['tp']}: {in_words(report['regime'])}.")
        return
    per_device = report["critical_batch_tokens_per_device"]
    st.metric(
        "critical batch (book, tokens per step)",
        f"{tokens:,.0f}",
        f"{per_device:,.0f} per device; now {setup.train.batch * setup.train.seq:,}",
        delta_color="off",
        delta_arrow="off",
    )
