"""The explorer's inputs: widget keys, defaults, URL query parameters and spec building.

Every input has a key, a default and a parser; the URL holds the inputs that differ from
their defaults, so a shared link reproduces the view. Query values are parsed by type
(int, float, bool, one of a list) — never evaluated. Building the specs turns every
``ValueError`` into a message keyed by the sidebar section it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from costmodel import PRESETS, ModelSpec, ParallelSpec, TrainSpec, get_hardware, get_model
from costmodel.catalog.hardware import HARDWARE
from costmodel.specs import model as S
from costmodel.specs.hardware import Hardware
from costmodel.specs.parallel import OVERLAP_RULES, fill_dp

MODEL_OVERRIDES = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab")


@dataclass(frozen=True)
class Field:
    key: str
    default: Any
    parse: Callable[[str], Any]
    section: str


def _int(text: str) -> int:
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return value


def _bool(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return text == "1"


def _choice(options) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"must be one of {', '.join(map(str, options))}")
        return text

    return parse


def _zero(text: str) -> int:
    if text not in ("1", "2", "3"):
        raise ValueError("must be 1, 2 or 3")
    return int(text)


def _optional_int(text: str) -> int | None:
    return None if text == "" else int(text)


FIELDS: tuple[Field, ...] = (
    Field("preset", "cs336-2.7b", _choice(list(PRESETS)), "model"),
    *(Field(k, None, _optional_int, "model") for k in MODEL_OVERRIDES),
    Field("batch", 32, _int, "training"),
    Field("seq", 1024, _int, "training"),
    Field("precision", "bf16-mixed", _choice(S.PRECISIONS), "training"),
    Field("optimizer", "adamw", _choice(S.OPTIMIZERS), "training"),
    Field("optimizer_impl", "foreach", _choice(S.OPTIMIZER_IMPLS), "training"),
    Field("attention", "flash", _choice(S.ATTENTION_KERNELS), "training"),
    Field("recompute", "none", _choice(S.RECOMPUTE_POLICIES), "training"),
    Field("grad_accum", 1, _int, "training"),
    Field("hardware", "h100-sxm", _choice(list(HARDWARE)), "cluster"),
    Field("gpus_per_node", 8, _int, "cluster"),
    Field("nodes", 1, _int, "cluster"),
    Field("fsdp", 8, _int, "cluster"),
    Field("zero", 3, _zero, "cluster"),
    Field("tp", 1, _int, "cluster"),
    Field("sequence_parallel", False, _bool, "cluster"),
    Field("pp", 1, _int, "cluster"),
    Field("cp", 1, _int, "cluster"),
    Field("overlap", "max", _choice(OVERLAP_RULES), "cluster"),
    Field("token_budget", 0.0, _float, "cost"),
    Field("price_per_hour", 0.0, _float, "cost"),
)
BY_KEY = {f.key: f for f in FIELDS}


def from_query(query: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Values for every field (defaults where absent) and one message per bad parameter."""
    values, problems = {f.key: f.default for f in FIELDS}, []
    for key, raw in query.items():
        field = BY_KEY.get(key)
        if field is None:
            problems.append(f"URL parameter {key!r} is unknown; ignored")
            continue
        try:
            values[key] = field.parse(str(raw))
        except ValueError as err:
            problems.append(f"URL parameter {key}={raw!r}: {err}; using {field.default!r}")
    return values, problems


def to_query(values: Mapping[str, Any]) -> dict[str, str]:
    """The inputs that differ from their defaults, as URL query strings."""
    out = {}
    for f in FIELDS:
        value = values.get(f.key, f.default)
        if value == f.default or (value is None and f.default is None):
            continue
        out[f.key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


@dataclass(frozen=True)
class Setup:
    model: ModelSpec
    train: TrainSpec
    parallel: ParallelSpec
    hardware: Hardware
    devices: int


def _section_of(message: str) -> str:
    head = message.split(" ", 1)[0].strip("'\"")
    for f in FIELDS:
        if f.key == head:
            return f.section
    if head in {x.name for x in fields(ModelSpec)}:
        return "model"
    if head in {x.name for x in fields(TrainSpec)}:
        return "training"
    return "cluster"


def build(values: Mapping[str, Any], model: ModelSpec | None = None) -> tuple[Setup | None, dict]:
    """The specs, or None and {section: message}. ``model`` replaces the preset (upload)."""
    try:
        base = model or get_model(values["preset"])
        overrides = {k: values[k] for k in MODEL_OVERRIDES if values.get(k) is not None}
        spec = base.replace(**overrides)
        train = TrainSpec(
            **{
                k: values[k]
                for k in (
                    "batch",
                    "seq",
                    "precision",
                    "optimizer",
                    "optimizer_impl",
                    "attention",
                    "recompute",
                    "grad_accum",
                )
            }
        )
        if spec.pos == "learned" and train.seq > spec.max_positions:
            raise ValueError(
                f"seq must be <= max_positions={spec.max_positions} for learned positions"
            )
        hardware = get_hardware(values["hardware"])
        for key in ("gpus_per_node", "nodes"):
            if not isinstance(values[key], int) or values[key] < 1:
                raise ValueError(f"{key} must be an integer >= 1 (got {values[key]!r})")
        devices = values["gpus_per_node"] * values["nodes"]
        layout = {k: values[k] for k in ("fsdp", "zero", "tp", "sequence_parallel", "pp", "cp")}
        parallel = fill_dp(ParallelSpec(**layout, overlap=values["overlap"]), devices)
        parallel.check(spec, train)
        for key in ("token_budget", "price_per_hour"):
            if values[key] < 0:
                raise ValueError(f"{key} must be >= 0 (got {values[key]})")
    except ValueError as err:
        message = str(err.args[0]) if err.args else str(err)
        return None, {_section_of(message): message}
    return Setup(spec, train, parallel, hardware, devices), {}
