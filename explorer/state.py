"""The explorer's inputs: which of costmodel's inputs the sidebar shows, and the URL.

Keys, types, defaults, choices and sections come from :data:`costmodel.inputs.INPUTS`, the
schema the CLI's flags are generated from, and ``costmodel.inputs.build`` turns them into
specs for both, so the app and the CLI agree on defaults and messages. The app needs two
inputs the CLI may omit (a model and a device): ``APP_REQUIRED`` gives them. The URL holds
the inputs that differ from what the app starts with, so a shared link reproduces the view.
Query values are parsed by type (int, float, 0/1, one of a list), never evaluated.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Mapping
from typing import Any

from costmodel.catalog.files import MAX_BYTES
from costmodel.catalog.hardware import device_choices
from costmodel.inputs import BY_KEY, Input, Setup, build, section_of
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.model import ModelSpec
from explorer.page_state import EMBED

MODEL_OVERRIDES = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab")
TRAINING = ("batch", "seq", "precision", "optimizer", "optimizer_impl", "attention")
TRAINING += ("attention_kernel", "elementwise", "recompute", "grad_accum", "microbatch")
TRAINING += ("finetune", "lora_rank", "lora_targets", "fp8_recipe")
CLUSTER = ("hardware", "gpus", "framework", "fsdp", "zero", "tp", "sequence_parallel", "pp")
CLUSTER += ("pp_interleave", "pp_schedule", "cp", "ep", "etp", "ep_dispatcher", "ep_imbalance")
CLUSTER += ("capacity_factor", "ep_overlap")
CLUSTER += ("overlap",)
CLUSTER += ("grad_reduce_fp32",)
COST = ("token_budget", "price_per_hour")
SHOWN: tuple[str, ...] = ("model", *MODEL_OVERRIDES, *TRAINING, *CLUSTER, *COST)
APP_REQUIRED = {"model": "cs336-2.7b", "hardware": "h100-sxm", "zero": 3}
"""What the app starts with where costmodel has no default (the CLI asks for them, or, for
the ZeRO stage, takes the framework's own: the widget always holds a stage, which
:func:`_given` passes only where the user picks one)."""

FIELDS: tuple[Input, ...] = tuple(BY_KEY[k] for k in SHOWN)
APP_UNSET = {"fsdp": None}
"""Inputs the app leaves to the framework, as the CLI does when a flag is not given: FSDP2
and DeepSpeed shard over every data-parallel device, not over the schema's fsdp 1."""
START: dict[str, Any] = {**{f.key: f.default for f in FIELDS}, **APP_REQUIRED, **APP_UNSET}
ALTERNATIVES = {"dp": ("batch", "gpus", "grad_accum", "microbatch"), "gpus": ("tp", "pp", "cp")}
"""Widgets that can mend an error about an input the sidebar has no widget for (``dp``
is what the devices leave after the other degrees), or that no value of its own mends
(no device count takes tp 3 of 32 heads)."""


def _given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs as ``build`` takes them. The ZeRO widget always holds a stage: it is
    passed where the sidebar sets the shard degree or the framework shards by default; a
    framework that does not (the reference model's DDP), or that runs its own stage (FSDP2,
    Megatron), is left to its default, as the CLI is without ``--zero`` (``--zero`` given
    asks for a shard group). The adapters' rank and targets are passed only with LoRA or
    QLoRA (their widgets show only then), the fp8 scaling under fp8."""
    given = {k: values.get(k) for k in SHOWN}
    framework = given.get("framework") or BY_KEY["framework"].default
    unsharded = given.get("fsdp") is None and not trait(framework, "shards_by_default")
    if unsharded or not trait(framework, "zero_stages"):  # or the framework's own stage
        given["zero"] = None  # not given (build drops what is None)
    if (given.get("finetune") or "full") == "full":  # the adapter widgets are hidden then
        given["lora_rank"] = given["lora_targets"] = None
    if given.get("precision") != "fp8":  # the fp8 scaling widget shows under fp8 only
        given["fp8_recipe"] = None
    return given


def defaulted(values: Mapping[str, Any]) -> frozenset[str]:
    """The inputs the user left as the app starts them, or that it has no widget for: the
    CLI's flags not given, whose defaults the assumptions line names as defaults (a ZeRO
    stage left at 3 under DeepSpeed is costmodel's default, not a choice)."""
    given = _given(values)
    return frozenset(k for k in BY_KEY if given.get(k) is None or given[k] == START.get(k))


def choices(key: str) -> tuple[Any, ...]:
    """The options of a choice input (devices: the catalog and the measured profiles of
    ``$COSTMODEL_PROFILES``)."""
    return device_choices() if key == "hardware" else BY_KEY[key].choices or ()


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
        if field is None and key in EMBED:
            continue
        if field is None:
            problems[key] = f"{key[:40]!r} is not an input of this page; ignored"
            continue
        try:
            values[key] = parse(field, str(raw))
        except ValueError as err:
            start = "unset" if START[key] is None else START[key]
            problems[key] = f"{key}={str(raw)[:40]!r} {err}; using {start}"
    return values, problems


UPLOAD_KEY = "config"
"""The URL parameter holding an uploaded config.json (compressed), so a shared link
reproduces an uploaded model rather than showing the preset."""


def encode_config(data: bytes) -> str:
    """A config.json's bytes as URL-safe text (zlib, then base64)."""
    return base64.urlsafe_b64encode(zlib.compress(data, 9)).decode("ascii")


def decode_config(text: str) -> bytes:
    """The bytes :func:`encode_config` wrote; ValueError in words for anything else
    (never more than a config.json's size limit is inflated)."""
    try:
        packed = base64.urlsafe_b64decode(text.encode("ascii"))
        inflate = zlib.decompressobj()
        data = inflate.decompress(packed, MAX_BYTES + 1)
    except (ValueError, zlib.error):
        raise ValueError("the link's config is damaged (not what this app writes)") from None
    if len(data) > MAX_BYTES:
        raise ValueError("the link's config is larger than a config.json may be")
    if not inflate.eof:
        raise ValueError("the link's config is damaged (not what this app writes)")
    return data


def to_query(values: Mapping[str, Any]) -> dict[str, str]:
    """The inputs that differ from the start, as URL query strings."""
    out = {}
    for f in FIELDS:
        value = values.get(f.key, START[f.key])
        if value == START[f.key] or value is None:
            continue
        out[f.key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def widget_of(field: str) -> str:
    """The sidebar widget an error about ``field`` is shown under: the field's own, or
    for a derived one (``dp``) the first widget that can change it, or its section's first."""
    head = field.split(".")[0]
    if head in SHOWN:
        return head
    if head in ALTERNATIVES:
        return ALTERNATIVES[head][0]
    return {"model": "model", "training": "batch", "cost": "token_budget"}.get(
        section_of(head), "hardware"
    )


def setup_of(
    values: Mapping[str, Any], model: ModelSpec | str | None = None
) -> tuple[Setup | None, dict[str, str]]:
    """The specs, or None and {widget: message} (the widget the bad input is shown under,
    :func:`widget_of`). ``model``: an uploaded model, or why an upload was refused."""
    if isinstance(model, str):
        return None, {"model": model}
    try:
        setup = build(_given(values), model)
    except SpecError as err:
        return None, {widget_of(err.field): err.message}
    except ValueError as err:  # a parser outside the spec layer (e.g. an HF config)
        return None, {"model": str(err.args[0]) if err.args else str(err)}
    return setup, {}


def options_of(field: Input) -> tuple[Any, ...]:
    """The values a choice or yes/no input takes (none for a number or free text)."""
    return choices(field.key) or ((True, False) if field.kind is bool else ())


def _neighbours(field: Input, current: Any, reach: int) -> list[Any]:
    """Values to try for ``field``, nearest first: the other options of a choice or a
    yes/no input, whole numbers at growing distance from an integer one."""
    options = options_of(field)
    if options:
        return [o for o in options if o != current]
    if field.kind is not int or not isinstance(current, int) or isinstance(current, bool):
        return []
    near = (c for d in range(1, reach + 1) for c in (current - d, current + d))
    return [c for c in near if 1 <= c <= MAX_INT]


def nearest_valid(
    values: Mapping[str, Any], field: str, model: ModelSpec | str | None = None, reach: int = 256
) -> Any:
    """The value of ``field`` nearest its current one (whole numbers within ``reach``, or
    another option) that makes the inputs valid, or None (nothing valid nearby)."""
    input_ = BY_KEY.get(field)
    if input_ is None or field not in SHOWN:
        return None
    for candidate in _neighbours(input_, values.get(field), reach):
        if setup_of({**values, field: candidate}, model)[0] is not None:
            return candidate
    return None


def fixes(values: Mapping[str, Any], model: ModelSpec | str | None = None) -> list[tuple[str, Any]]:
    """[(widget, value)]: one-click mends of the error these values raise, each the
    nearest valid value of the input the error names, or, for one without a widget
    (``dp``), of each widget that can change it."""
    field = failing_field(values, model)
    if field is None:
        return []
    found = []
    for keys in ((field,) if field in SHOWN else (), ALTERNATIVES.get(field, ())):
        for key in keys:
            near = nearest_valid(values, key, model)
            if near is not None:
                found.append((key, near))
        if found:
            break
    return found


def failing_field(values: Mapping[str, Any], model: ModelSpec | str | None = None) -> str | None:
    """The input a SpecError names for these values (None if they build, or if the
    failure is not about one input)."""
    if isinstance(model, str):
        return None
    try:
        build(_given(values), model)
    except SpecError as err:
        return err.field.split(".")[0]
    except ValueError:
        return None
    return None
