"""State of the Plan, Offload and Padding pages: where their inputs start, and the URL.

A page's inputs start from the Estimate page's current model, device, GPUs, sequence
length, batch and precision (the Estimate page leaves them in session state,
:func:`remember_estimate`), then from the page's own URL parameters, so a link reproduces
the view. When the Estimate page's inputs change, the page follows them the next time it
is shown. Each page keeps its values in a plain session-state entry (widget state is
dropped while another page is shown) and writes them all to the URL on every run.
URL values are parsed by type (whole number, number, one of a list), never evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import streamlit as st

ESTIMATE = "_estimate_inputs"
"""Session key of the Estimate page's current inputs (the shared ones)."""
SHARED = ("model", "hardware", "gpus", "seq", "batch", "precision", "framework")
NOT_SHARED = {"serve": ("batch", "precision")}
"""Per page, a shared input that means something else there: the Serve page's batch is
requests at once, not the training step's sequences; its precision is the served weights',
not the training's matmuls (fp8 training set fp8 weights unsaid: a probe)."""


@dataclass(frozen=True)
class PageInput:
    """One input of a page: its URL parameter, type, start, and allowed values."""

    key: str
    kind: type
    """int, float, str (one of ``choices``; without them free text) or list (several of
    ``choices``)."""
    default: Any
    choices: tuple[Any, ...] = ()
    lo: float = 1
    hi: float = 2**24


UPLOADED = "_estimate_uploaded"
"""Session key: whether the Estimate page prices an uploaded config.json, which the other
pages, taking presets, do not carry (they say so)."""


def remember_estimate(values: Mapping[str, Any], uploaded: bool = False) -> None:
    """The Estimate page's inputs that the other pages start from (None: not set)."""
    st.session_state[ESTIMATE] = {k: values[k] for k in SHARED if values.get(k) is not None}
    st.session_state[UPLOADED] = uploaded


EMBED = {"embed", "embed_options"}
"""Streamlit's own URL parameters (an embedded app's), which every page keeps."""


def parse(field: PageInput, text: str) -> Any:
    """One URL value; ValueError with a short reason in words."""
    if field.kind is list:
        items = [t for t in text.split(",") if t]
        bad = [t for t in items if t not in field.choices]
        if bad:
            raise ValueError(f"must be among {', '.join(map(str, field.choices))}")
        return items
    if field.kind is str and not field.choices:  # free text, read by its own parser
        if len(text) > 200:
            raise ValueError("is longer than 200 characters")
        return text
    if field.kind is str:
        if text not in field.choices:
            raise ValueError(f"must be one of {', '.join(map(str, field.choices))}")
        return text
    try:
        value = field.kind(text) if field.kind is float or text.isdigit() else None
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not field.lo <= value <= field.hi:
        raise ValueError(f"must be a number from {_shown(field.lo)} to {_shown(field.hi)}")
    return value


def _shown(bound: float) -> str:
    """A range bound as a reader writes it: 16,777,216, not 1.67772e+07; 0.1 as 0.1."""
    return f"{bound:,.0f}" if float(bound).is_integer() else f"{bound:g}"


def _shared(page: str, inputs: tuple[PageInput, ...]) -> dict[str, Any]:
    """The Estimate page's current values of this page's inputs (valid ones only)."""
    current = st.session_state.get(ESTIMATE, {})
    out = {}
    for f in (f for f in inputs if f.key not in NOT_SHARED.get(page, ())):
        value = current.get(f.key)
        if value is None:
            continue
        try:
            out[f.key] = parse(f, str(value))
        except ValueError:
            continue  # e.g. a batch past this page's range: the page's own start stays
    return out


def start(page: str, inputs: tuple[PageInput, ...]) -> list[str]:
    """Put each input's value under its widget key (``{page}_{key}``) before the widgets
    draw; returns the URL parameters not used, each in words."""
    stored, problems = st.session_state.get(f"_{page}"), []
    shared = _shared(page, inputs)
    if st.session_state.get(UPLOADED) and any(f.key == "model" for f in inputs):
        st.info("The config.json uploaded on the Estimate page is not carried here: this "
                "page prices the preset model chosen below; its other inputs follow the "
                "Estimate page.")  # fmt: skip
    reset: set[str] = set()  # widgets whose value the page sets now
    if stored is None:  # the first visit: defaults, the Estimate page's, the link's
        stored = {f.key: f.default for f in inputs} | shared | {"_from": shared}
        query = st.query_params.to_dict()
        known = {f.key for f in inputs} | EMBED
        problems += [f"{k[:40]!r} is not an input of this page; ignored"
                     for k in query if k not in known]  # fmt: skip
        for f in (f for f in inputs if f.key in query):
            try:
                stored[f.key] = parse(f, query[f.key])
            except ValueError as err:  # the value kept instead is said (a probe)
                kept = stored[f.key]  # a list as a reader writes it, not Python's repr
                kept = ", ".join(map(str, kept)) if isinstance(kept, list | tuple) else kept
                problems.append(f"{f.key}={query[f.key][:40]!r} {err}; using {kept}")
        reset = {f.key for f in inputs}
    elif shared != stored["_from"]:  # the Estimate page changed since: follow it
        reset = {k for k, v in shared.items() if stored["_from"].get(k) != v}
        stored = {**stored, **shared, "_from": shared}
    for f in inputs:  # a widget's own state is kept (a submitted form), or was dropped
        key = f"{page}_{f.key}"
        if f.key in reset or key not in st.session_state:
            st.session_state[key] = stored[f.key]
    st.session_state[f"_{page}"] = stored
    return problems


def finish(page: str, inputs: tuple[PageInput, ...]) -> dict[str, Any]:
    """The widgets' values (after the form), kept for the next visit and written to the
    URL; returns them by input key."""
    values = {f.key: st.session_state[f"{page}_{f.key}"] for f in inputs}
    st.session_state[f"_{page}"] = {**st.session_state[f"_{page}"], **values}
    st.query_params.from_dict({k: _text(v) for k, v in values.items()})
    return values


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else f"{value:g}" \
        if isinstance(value, float) else str(value)  # fmt: skip


def warn_unused(problems: list[str]) -> None:
    """One warning listing the URL parameters :func:`start` could not use (none: nothing)."""
    if problems:
        st.warning("Link parameters not used:\n" + "\n".join(f"- {p}" for p in problems))
