"""The explorer's inputs: which of costmodel's inputs the sidebar shows, and the URL.

Keys, types, defaults, choices and sections come from :data:`costmodel.inputs.INPUTS`, the
schema the CLI's flags are generated from, and ``costmodel.inputs.build`` turns them into
specs for both, so the app and the CLI agree on defaults and messages. The app needs two
inputs the CLI may omit (a model and a device): ``APP_REQUIRED`` gives them. The URL holds
the inputs that differ from what the app starts with, so a shared link reproduces the view.
Query values are parsed by type (int, float, 0/1, one of a list), never evaluated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from costmodel.catalog.hardware import HARDWARE
from costmodel.inputs import BY_KEY, Input, Setup, build, section_of
from costmodel.specs.checks import SpecError
from costmodel.specs.model import ModelSpec

MODEL_OVERRIDES = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab")
TRAINING = ("batch", "seq", "precision", "optimizer", "optimizer_impl", "attention")
TRAINING += ("elementwise", "recompute", "grad_accum", "microbatch")
CLUSTER = ("hardware", "gpus", "framework", "fsdp", "zero", "tp", "sequence_parallel", "pp")
CLUSTER += ("pp_interleave", "cp", "overlap", "grad_reduce_fp32")
COST = ("token_budget", "price_per_hour")
SHOWN: tuple[str, ...] = ("model", *MODEL_OVERRIDES, *TRAINING, *CLUSTER, *COST)
APP_REQUIRED = {"model": "cs336-2.7b", "hardware": "h100-sxm"}
"""What the app starts with where costmodel has no default (the CLI asks for them)."""

FIELDS: tuple[Input, ...] = tuple(BY_KEY[k] for k in SHOWN)
START: dict[str, Any] = {**{f.key: f.default for f in FIELDS}, **APP_REQUIRED}


def choices(key: str) -> tuple[Any, ...]:
    """The options of a choice input (devices: the catalog)."""
    return tuple(HARDWARE) if key == "hardware" else BY_KEY[key].choices or ()


def parse(field: Input, text: str) -> Any:
    """One URL value by the input's type; raises ValueError with a short reason."""
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
        value = float(text)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("not a finite number")
        return value
    return int(text)


def from_query(query: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Values for every field (the start where absent) and one message per bad parameter."""
    values, problems = dict(START), []
    shown = {f.key: f for f in FIELDS}
    for key, raw in query.items():
        field = shown.get(key)
        if field is None:
            problems.append(f"URL parameter {key!r} is unknown; ignored")
            continue
        try:
            values[key] = parse(field, str(raw))
        except ValueError as err:
            problems.append(f"URL parameter {key}={raw!r}: {err}; using {START[key]!r}")
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
    values: Mapping[str, Any], model: ModelSpec | None = None
) -> tuple[Setup | None, dict[str, str]]:
    """The specs, or None and {section: message} (the section the bad input is in)."""
    try:
        setup = build({k: values.get(k) for k in SHOWN}, model)
    except SpecError as err:
        return None, {section_of(err.field): err.message}
    except ValueError as err:  # a parser outside the spec layer (e.g. an HF config)
        return None, {"model": str(err.args[0]) if err.args else str(err)}
    return setup, {}
