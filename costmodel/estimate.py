"""Every quantity of one configuration as a sympy expression, and their numbers.

``quantities(model, train)`` is the single source of truth: a flat dict whose keys are the
dotted JSON paths (``"memory_bytes.peak"``) and whose values are expressions over the
symbols in :mod:`costmodel.symbols`. The expressions depend only on the *structure* of the
specs (kinds, flags, precision, kernels); sizes enter as symbols. Structures are cached and
lambdified once, so a scalar estimate is a Python call and a sweep is a numpy call.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from typing import Any

import sympy as sp

from .flops import backward_flops_by_op, flop_conventions, flop_totals, forward_flops_by_op
from .memory import activation_memory, peak_memory, state_memory
from .params import non_embedding_params, param_breakdown
from .specs import ModelSpec, TrainSpec
from .symbols import ALL_SYMBOLS, values_for

MODEL_STRUCTURE = ("ffn", "norm", "bias", "qkv_bias", "tied", "pos", "ffn_only")
TRAIN_STRUCTURE = ("precision", "optimizer", "attention", "recompute")

# Sizes do not change the expressions, so structures are built from these placeholders.
_PLACEHOLDER_MODEL = {"vocab": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 8}


def _prefixed(prefix: str, parts: dict[str, sp.Expr]) -> dict[str, sp.Expr]:
    return {f"{prefix}.{k}": v for k, v in parts.items()}


def quantities(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """Flat dict of dotted key -> expression for every reported quantity."""
    out: dict[str, sp.Expr] = _prefixed("params", param_breakdown(model))
    out["params.non_embedding"] = non_embedding_params(model)
    out.update(_prefixed("flops", flop_totals(model, train)))
    out.update(_prefixed("flops.forward_by_op", forward_flops_by_op(model)))
    out.update(_prefixed("flops.backward_by_op", backward_flops_by_op(model, train)))
    out.update(_prefixed("flops.conventions", flop_conventions(model, train)))
    acts = activation_memory(model, train)
    mem = {**state_memory(model, train), "activations": acts.pop("total")}
    mem.update(peak_memory(model, train))
    out.update(_prefixed("memory_bytes", mem))
    out.update(_prefixed("memory_bytes.activations_by_op", acts))
    return {k: sp.sympify(v) for k, v in out.items()}


def structure_of(model: ModelSpec, train: TrainSpec) -> tuple:
    """The part of the specs that changes expressions (everything but the sizes)."""
    return tuple(getattr(model, f) for f in MODEL_STRUCTURE) + tuple(
        getattr(train, f) for f in TRAIN_STRUCTURE
    )


@dataclass(frozen=True)
class Compiled:
    """Expressions of one structure, lambdified for scalars (exact ints) and numpy."""

    keys: tuple[str, ...]
    exprs: tuple[sp.Expr, ...]
    scalar: Any
    vector: Any


@functools.lru_cache(maxsize=256)
def compiled(structure: tuple) -> Compiled:
    """Build and lambdify the expressions of one structure (cached per process)."""
    m_kw = dict(zip(MODEL_STRUCTURE, structure[: len(MODEL_STRUCTURE)], strict=True))
    t_kw = dict(zip(TRAIN_STRUCTURE, structure[len(MODEL_STRUCTURE) :], strict=True))
    sizes = dict(_PLACEHOLDER_MODEL, vocab=0) if m_kw["ffn_only"] else _PLACEHOLDER_MODEL
    exprs = quantities(ModelSpec(**sizes, **m_kw), TrainSpec(**t_kw))
    keys = tuple(exprs)
    values = tuple(exprs.values())
    scalar = sp.lambdify(ALL_SYMBOLS, values, modules=[{"Max": max}, "math"], cse=True)
    vector = sp.lambdify(ALL_SYMBOLS, values, modules="numpy", cse=True)
    return Compiled(keys=keys, exprs=values, scalar=scalar, vector=vector)


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        node = root
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return root


@dataclass(frozen=True)
class Estimate:
    """Numbers (exact ints where the quantity is a count) and expressions of one config."""

    model: ModelSpec
    train: TrainSpec
    values: dict[str, int | float]

    def __getitem__(self, key: str) -> int | float:
        return self.values[key]

    def expr(self, key: str) -> sp.Expr:
        """The symbolic expression behind ``key`` (sizes as symbols)."""
        comp = compiled(structure_of(self.model, self.train))
        try:
            return comp.exprs[comp.keys.index(key)]
        except ValueError:
            raise KeyError(f"unknown quantity {key!r}; known: {', '.join(comp.keys)}") from None

    def to_dict(self) -> dict[str, Any]:
        """Nested dict for JSON: specs plus every quantity."""
        return {
            "model": {f.name: getattr(self.model, f.name) for f in fields(self.model)},
            "train": {f.name: getattr(self.train, f.name) for f in fields(self.train)},
            **nest(self.values),
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


def _as_number(value: Any) -> int | float:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def estimate(model: ModelSpec, train: TrainSpec) -> Estimate:
    """Evaluate every quantity for one configuration (exact integers for counts)."""
    if model.pos == "learned" and train.seq > model.max_positions:
        raise ValueError(
            f"seq must be <= max_positions for learned positions "
            f"(got seq={train.seq}, max_positions={model.max_positions})"
        )
    comp = compiled(structure_of(model, train))
    symbol_values = values_for(model, train)
    numbers = comp.scalar(*(symbol_values[s] for s in ALL_SYMBOLS))
    return Estimate(
        model, train, {k: _as_number(v) for k, v in zip(comp.keys, numbers, strict=True)}
    )


def exact(model: ModelSpec, train: TrainSpec, key: str) -> sp.Expr:
    """Evaluate one quantity by sympy substitution (slow; the reference for tests)."""
    comp = compiled(structure_of(model, train))
    return comp.exprs[comp.keys.index(key)].subs(values_for(model, train))
