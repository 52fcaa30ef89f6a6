"""Vectorised evaluation: the same lambdified expressions over numpy arrays."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

import numpy as np

from .estimate import EVAL_SYMBOLS, compiled, structure_of
from .presets import get_model
from .specs import ModelSpec, TrainSpec
from .symbols import B, D, F, H, K, L, P, T, V, b, d_h

_MODEL_FIELDS = {f.name for f in fields(ModelSpec)}
_TRAIN_FIELDS = {f.name for f in fields(TrainSpec)}
_NUMERIC = {
    "vocab",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "max_positions",
    "batch",
    "seq",
    "grad_accum",
}


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray | list | tuple | range)


def _int_array(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr))):
        raise ValueError(f"{name} must hold integers (got dtype {arr.dtype})")
    arr = arr.astype(np.int64)
    if np.any(arr < 1):
        raise ValueError(f"{name} must be >= 1 everywhere (min {arr.min()})")
    return arr


def _check(cond: np.ndarray, message: str) -> None:
    if not np.all(cond):
        raise ValueError(message)


def sweep(
    model: str | ModelSpec = "cs336-2.7b",
    *,
    quantities: Iterable[str] | None = None,
    **overrides: Any,
) -> dict[str, np.ndarray]:
    """Every quantity over a broadcast grid of sizes.

    ``overrides`` are ModelSpec or TrainSpec fields. Sizes (``batch``, ``seq``, ``d_model``,
    ...) may be scalars or arrays, broadcast together; kinds (``precision``, ``attention``,
    ...) must be scalars. Returns float64 arrays keyed like ``estimate`` (``"flops.step"``).
    """
    unknown = sorted(set(overrides) - _MODEL_FIELDS - _TRAIN_FIELDS)
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    bad = sorted(k for k, v in overrides.items() if _is_array(v) and k not in _NUMERIC)
    if bad:
        raise ValueError(f"{', '.join(bad)} must be scalar (only sizes can be arrays)")
    arrays = {k: _int_array(k, v) for k, v in overrides.items() if _is_array(v)}
    # Specs built from the scalars and the first grid point check kinds and flags; the
    # whole grid is checked below, vectorised.
    first = {k: int(a.flat[0]) for k, a in arrays.items() if a.size}
    scalars = {k: v for k, v in overrides.items() if k not in arrays}
    point = {**scalars, **first}
    m_kw = {k: v for k, v in point.items() if k in _MODEL_FIELDS}
    base_model = get_model(model, **m_kw) if isinstance(model, str) else model.replace(**m_kw)
    base_train = TrainSpec(**{k: v for k, v in point.items() if k in _TRAIN_FIELDS})
    base_model = base_model.replace(**{k: v for k, v in scalars.items() if k in _MODEL_FIELDS})
    grid = dict(zip(arrays, np.broadcast_arrays(*arrays.values()), strict=True)) if arrays else {}

    def get(name: str, spec: Any) -> np.ndarray:
        return grid.get(name, np.asarray(getattr(spec, name), dtype=np.int64))

    d_model, n_heads = get("d_model", base_model), get("n_heads", base_model)
    if "head_dim" in grid or not ({"d_model", "n_heads"} & set(grid)):
        head_dim = get("head_dim", base_model)
    else:
        _check(d_model % n_heads == 0, "n_heads must divide d_model when head_dim is derived")
        head_dim = d_model // n_heads
    mha = base_model.n_kv_heads == base_model.n_heads
    kv = n_heads if "n_kv_heads" not in grid and mha else get("n_kv_heads", base_model)
    _check(n_heads % kv == 0, "n_kv_heads must divide n_heads everywhere")
    batch, accum, seq = (
        get("batch", base_train),
        get("grad_accum", base_train),
        get("seq", base_train),
    )
    _check(batch % accum == 0, "grad_accum must divide batch everywhere")
    positions = get("max_positions", base_model)
    if base_model.pos == "learned":
        _check(seq <= positions, "seq must be <= max_positions for learned positions")
    values = {
        V: get("vocab", base_model),
        D: d_model,
        F: get("d_ff", base_model),
        L: get("n_layers", base_model),
        H: n_heads,
        K: kv,
        d_h: head_dim,
        P: positions,
        B: batch,
        b: batch // accum,
        T: seq,
    }
    comp = compiled(structure_of(base_model, base_train))
    args = [np.asarray(values.get(s, 1), dtype=np.float64) for s in EVAL_SYMBOLS]
    shape = np.broadcast_shapes(*(a.shape for a in args))
    wanted = set(comp.keys if quantities is None else quantities)
    missing = sorted(wanted - set(comp.keys))
    if missing:
        raise ValueError(f"unknown quantity: {', '.join(missing)}")
    results = comp.vector(*args)
    return {
        k: np.broadcast_to(np.asarray(v, dtype=np.float64), shape)
        for k, v in zip(comp.keys, results, strict=True)
        if k in wanted
    }
