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
from typing import TYPE_CHECKING, Any

import sympy as sp

from .flops import backward_flops_by_op, flop_conventions, flop_totals, forward_flops_by_op
from .memory import activation_memory, peak_memory, state_memory
from .parallel import ParallelSpec
from .params import non_embedding_params, param_breakdown
from .specs import ModelSpec, TrainSpec
from .symbols import ALL_SYMBOLS, HARDWARE_SYMBOLS, PARALLEL_SYMBOLS, as_expr, values_for

if TYPE_CHECKING:
    from .hardware import Hardware

MODEL_STRUCTURE = ("ffn", "norm", "bias", "qkv_bias", "tied", "pos", "ffn_only")
TRAIN_STRUCTURE = ("precision", "optimizer", "optimizer_impl", "attention", "recompute")
EVAL_SYMBOLS = ALL_SYMBOLS + PARALLEL_SYMBOLS + HARDWARE_SYMBOLS

# Sizes do not change the expressions, so structures are built from these placeholders.
_PLACEHOLDER_MODEL = {"vocab": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 8}


def _prefixed(prefix: str, parts: dict[str, sp.Expr]) -> dict[str, sp.Expr]:
    return {f"{prefix}.{k}": v for k, v in parts.items()}


def quantities(
    model: ModelSpec, train: TrainSpec, parallel: ParallelSpec | None = None
) -> dict[str, sp.Expr]:
    """Flat dict of dotted key -> expression for every reported quantity.

    With a ``parallel`` layout, adds per-device memory, communication, roofline step time
    and MFU (their expressions also use the parallel and hardware symbols).
    """
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
    if parallel is not None:
        from .distributed import sharded_memory
        from .timing import step_time

        out.update(_prefixed("memory_bytes_per_device", sharded_memory(model, train, parallel)))
        out.update(step_time(model, train, parallel))
    return {k: as_expr(v) for k, v in out.items()}


def structure_of(model: ModelSpec, train: TrainSpec, parallel: ParallelSpec | None = None) -> tuple:
    """The part of the specs that changes expressions (everything but the sizes)."""
    base = tuple(getattr(model, f) for f in MODEL_STRUCTURE) + tuple(
        getattr(train, f) for f in TRAIN_STRUCTURE
    )
    if parallel is None:
        return (*base, None)
    return (
        *base,
        (
            parallel.zero,
            parallel.sequence_parallel,
            parallel.pp > 1,
            parallel.pp_interleave > 1,
            parallel.overlap,
        ),
    )


@dataclass(frozen=True)
class Compiled:
    """Expressions of one structure, lambdified for scalars (exact ints) and numpy."""

    keys: tuple[str, ...]
    exprs: tuple[sp.Expr, ...]
    scalar: Any

    @functools.cached_property
    def vector(self) -> Any:
        """The numpy version, built on first use (sweeps need it, single estimates do not)."""
        return sp.lambdify(EVAL_SYMBOLS, self.exprs, modules="numpy", cse=True)


@functools.lru_cache(maxsize=256)
def compiled(structure: tuple) -> Compiled:
    """Build and lambdify the expressions of one structure (cached per process)."""
    n_model = len(MODEL_STRUCTURE)
    m_kw = dict(zip(MODEL_STRUCTURE, structure[:n_model], strict=True))
    t_kw = dict(zip(TRAIN_STRUCTURE, structure[n_model:-1], strict=True))
    sizes = dict(_PLACEHOLDER_MODEL, vocab=0) if m_kw["ffn_only"] else _PLACEHOLDER_MODEL
    parallel = None
    if structure[-1] is not None:
        zero, seq_par, pipelined, interleaved, overlap = structure[-1]
        parallel = ParallelSpec(
            zero=zero,
            sequence_parallel=seq_par,
            pp=2 if pipelined else 1,
            pp_interleave=2 if interleaved else 1,
            overlap=overlap,
        )
    exprs = quantities(ModelSpec(**sizes, **m_kw), TrainSpec(**t_kw), parallel)
    keys = tuple(exprs)
    values = tuple(exprs.values())
    scalar = sp.lambdify(EVAL_SYMBOLS, values, modules=[{"Max": max}, "math"], cse=True)
    return Compiled(keys=keys, exprs=values, scalar=scalar)


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
    parallel: ParallelSpec | None = None
    hardware: Hardware | None = None

    def __getitem__(self, key: str) -> int | float:
        return self.values[key]

    def expr(self, key: str) -> sp.Expr:
        """The symbolic expression behind ``key`` (sizes as symbols)."""
        comp = compiled(structure_of(self.model, self.train, self.parallel))
        try:
            return comp.exprs[comp.keys.index(key)]
        except ValueError:
            raise KeyError(f"unknown quantity {key!r}; known: {', '.join(comp.keys)}") from None

    def to_dict(self) -> dict[str, Any]:
        """Nested dict for JSON: specs plus every quantity."""
        out = {"model": _fields(self.model), "train": _fields(self.train)}
        if self.parallel is not None:
            out["parallel"] = _fields(self.parallel)
        if self.hardware is not None:
            out["hardware"] = self.hardware.name
        return {**out, **nest(self.values)}

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)


def _fields(spec: Any) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def _as_number(value: Any) -> int | float:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def symbol_values(
    model: ModelSpec,
    train: TrainSpec,
    parallel: ParallelSpec | None = None,
    hardware: Hardware | None = None,
) -> dict[sp.Symbol, float]:
    """Every symbol's number (parallel and hardware ones are 1 when not given)."""
    values: dict[sp.Symbol, float] = dict.fromkeys(PARALLEL_SYMBOLS + HARDWARE_SYMBOLS, 1)
    values.update(values_for(model, train))
    if parallel is not None:
        from .layout import layout_values

        if hardware is None:
            raise ValueError("hardware is required with a parallel layout")
        parallel.check(model, train)
        values.update(layout_values(train, parallel, hardware))
    return values


def estimate(
    model: ModelSpec,
    train: TrainSpec,
    parallel: ParallelSpec | None = None,
    hardware: Hardware | None = None,
) -> Estimate:
    """Evaluate every quantity for one configuration (exact integers for counts)."""
    if model.pos == "learned" and train.seq > model.max_positions:
        raise ValueError(
            f"seq must be <= max_positions for learned positions "
            f"(got seq={train.seq}, max_positions={model.max_positions})"
        )
    comp = compiled(structure_of(model, train, parallel))
    values = symbol_values(model, train, parallel, hardware)
    numbers = comp.scalar(*(values[s] for s in EVAL_SYMBOLS))
    return Estimate(
        model,
        train,
        {k: _as_number(v) for k, v in zip(comp.keys, numbers, strict=True)},
        parallel,
        hardware,
    )


def exact(model: ModelSpec, train: TrainSpec, key: str) -> sp.Expr:
    """Evaluate one quantity by sympy substitution (slow; the reference for tests)."""
    comp = compiled(structure_of(model, train))
    return comp.exprs[comp.keys.index(key)].subs(values_for(model, train))
