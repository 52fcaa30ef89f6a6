"""The explorer's inputs: which of costmodel's inputs the sidebar shows, and the URL.

Keys, types, defaults, choices and sections come from :data:`costmodel.inputs.INPUTS`, the
schema the CLI's flags are generated from, and ``costmodel.inputs.build`` turns them into
specs for both, so the app and the CLI agree on defaults and messages. The app needs two
inputs the CLI may omit (a model and a device): ``APP_REQUIRED`` gives them. The URL holds
the inputs that differ from what the app starts with, so a shared link reproduces the view.
Query values are parsed by type (int, float, 0/1, one of a list), never evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from costmodel.catalog.hardware import HARDWARE
from costmodel.inputs import BY_KEY, Input, Setup, build, section_of
from costmodel.specs.checks import SpecError
from costmodel.specs.model import ModelSpec

MODEL_OVERRIDES = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab")
TRAINING = ("batch", "seq", "precision", "optimizer", "optimizer_impl", "attention")
TRAINING += ("attention_kernel", "elementwise", "recompute", "grad_accum", "microbatch")
TRAINING += ("finetune", "lora_rank", "lora_targets")
CLUSTER = ("hardware", "gpus", "framework", "fsdp", "zero", "tp", "sequence_parallel", "pp")
CLUSTER += ("pp_interleave", "cp", "ep", "ep_imbalance", "capacity_factor", "ep_overlap")
CLUSTER += ("overlap",)
CLUSTER += ("grad_reduce_fp32",)
COST = ("token_budget", "price_per_hour")
SHOWN: tuple[str, ...] = ("model", *MODEL_OVERRIDES, *TRAINING, *CLUSTER, *COST)
APP_REQUIRED = {"model": "cs336-2.7b", "hardware": "h100-sxm"}
"""What the app starts with where costmodel has no default (the CLI asks for them)."""

FIELDS: tuple[Input, ...] = tuple(BY_KEY[k] for k in SHOWN)
START: dict[str, Any] = {**{f.key: f.default for f in FIELDS}, **APP_REQUIRED}


def choices(key: str) -> tuple[Any, ...]:
    """The options of a choice input (devices: the catalog)."""
    return tuple(HARDWARE) if key == "hardware" else BY_KEY[key].choices or ()


MAX_INT = 2**53
"""Largest integer a URL value may hold (the CLI's cap: exact in a float, fits int64)."""


def parse(field: Input, text: str) -> Any:
    """One URL value by the input's type; raises ValueError with a short reason in words.

    The widgets' own ranges apply (integers >= 1, numbers >= 0), so a value the sidebar
    could not hold is refused here rather than clamped silently by the widget."""
    if field.kind is bool:
        if text not in ("0", "1"):
            raise ValueError("must be 0 or 1")
        return text == "1"
    options = choices(field.key)
    if options:
        by_text = {str(o): o for o in options}
        if text not in by_text:
            raise ValueError(f"must be one of {', '.join(by_text)}")
        return by_text[text]
    if field.kind is float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("must be a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError("must be a finite number >= 0")
        return value
    if not (text.isascii() and text.isdigit()):
        raise ValueError("must be a whole number >= 1")
    value = int(text)
    if not 1 <= value <= MAX_INT:
        raise ValueError("must be between 1 and 2^53")
    return value


def from_query(query: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Values for every field (the start where absent) and {parameter: message} for each
    bad one (the start's value is used for it)."""
    values, problems = dict(START), {}
    shown = {f.key: f for f in FIELDS}
    for key, raw in query.items():
        field = shown.get(key)
        if field is None:
            problems[key] = f"{key[:40]!r} is not an input of this page; ignored"
            continue
        try:
            values[key] = parse(field, str(raw))
        except ValueError as err:
            start = "unset" if START[key] is None else START[key]
            problems[key] = f"{key}={str(raw)[:40]!r} {err}; using {start}"
    return values, problems


def to_query(values: Mapping[str, Any]) -> dict[str, str]:
    """The inputs that differ from the start, as URL query strings."""
    out = {}
    for f in FIELDS:
        value = values.get(f.key, START[f.key])
        if value == START[f.key] or value is None:
            continue
        out[f.key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def setup_of(
    values: Mapping[str, Any], model: ModelSpec | str | None = None
) -> tuple[Setup | None, dict[str, str]]:
    """The specs, or None and {section: message} (the section the bad input is in).
    ``model``: an uploaded model, or why an upload was refused (a string)."""
    if isinstance(model, str):
        return None, {"model": model}
    try:
        setup = build({k: values.get(k) for k in SHOWN}, model)
    except SpecError as err:
        return None, {section_of(err.field): err.message}
    except ValueError as err:  # a parser outside the spec layer (e.g. an HF config)
        return None, {"model": str(err.args[0]) if err.args else str(err)}
    return setup, {}


def nearest_valid(
    values: Mapping[str, Any], field: str, model: ModelSpec | str | None = None, reach: int = 256
) -> int | None:
    """The whole number closest to ``values[field]`` (within ``reach``) that makes the
    inputs valid, or None (not a whole-number input, or nothing valid nearby)."""
    current = values.get(field)
    input_ = BY_KEY.get(field)
    if input_ is None or input_.kind is not int or field not in SHOWN:
        return None
    if not isinstance(current, int) or isinstance(current, bool):
        return None
    for delta in range(1, reach + 1):
        for candidate in (current - delta, current + delta):
            if 1 <= candidate <= MAX_INT and setup_of({**values, field: candidate}, model)[0]:
                return candidate
    return None


def failing_field(values: Mapping[str, Any], model: ModelSpec | str | None = None) -> str | None:
    """The input a SpecError names for these values (None if they build, or if the
    failure is not about one input)."""
    if isinstance(model, str):
        return None
    try:
        build({k: values.get(k) for k in SHOWN}, model)
    except SpecError as err:
        return err.field.split(".")[0]
    except ValueError:
        return None
    return None
