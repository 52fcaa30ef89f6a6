"""Vectorised evaluation: the same compiled expressions as ``estimate`` over numpy grids.

Any ModelSpec, TrainSpec or ParallelSpec field may be an array; arrays broadcast together.
Grid points are grouped by *structure* (the kinds, flags and parallel features that change
the expressions), each group is checked by the specs' own rules
(:mod:`costmodel.specs`) and evaluated in one numpy call of that structure's compiled
expressions, with symbol values from the same function ``estimate`` uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import numpy as np

from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.engine.estimate import symbol_values
from costmodel.engine.quantities import (
    EVAL_SYMBOLS,
    MODEL_STRUCTURE,
    TRAIN_STRUCTURE,
    compiled,
    compiled_subset,
    structure_of,
)
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import (
    ModelSpec,
    TrainSpec,
    check_positions,
    derived_head_dim,
    model_rules,
    train_rules,
)
from costmodel.specs.parallel import ParallelSpec, cp_rule, layout_rules

_OWNERS = {cls: {f.name: f for f in fields(cls)} for cls in (ModelSpec, TrainSpec, ParallelSpec)}
_KINDS = {*MODEL_STRUCTURE, *TRAIN_STRUCTURE, "zero", "sequence_parallel", "overlap",
          "framework", "async_tp", "grad_reduce_fp32"}  # fmt: skip


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray | list | tuple | range)


def _as_grid(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value, dtype=object if name in _KINDS else None)
    if name in _KINDS:
        return arr
    if arr.dtype.kind == "f" and np.all(arr == np.round(arr)) and name != "bucket_mb":
        arr = arr.astype(np.int64)
    if name != "bucket_mb":
        checks.integer(name, arr)
    return arr


def sweep(
    model: str | ModelSpec = "cs336-2.7b",
    *,
    hardware: str | Hardware | None = None,
    quantities: Iterable[str] | None = None,
    **overrides: Any,
) -> dict[str, np.ndarray]:
    """Every quantity over a broadcast grid of spec fields.

    ``overrides`` are ModelSpec, TrainSpec or ParallelSpec fields, scalars or arrays. With
    ``hardware`` (or any ParallelSpec field, which needs it) the layout's per-device
    memory, time and MFU are included. Returns float64 arrays keyed like ``estimate``;
    a quantity that only some structures have (e.g. what full recomputation keeps) is NaN
    where it does not apply.
    """
    quantities = None if quantities is None else list(quantities)
    known = set().union(*_OWNERS.values())
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise SpecError(unknown[0], f"unknown field(s): {', '.join(unknown)}")
    base = get_model(model) if isinstance(model, str) else model
    layout = hardware is not None or bool(set(overrides) & set(_OWNERS[ParallelSpec]))
    if layout and hardware is None:
        raise SpecError("hardware", "hardware is required to sweep ParallelSpec fields")
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    grid = {k: _as_grid(k, v) for k, v in overrides.items() if _is_array(v)}
    shape = np.broadcast_shapes(*(a.shape for a in grid.values())) if grid else ()
    points = int(np.prod(shape))
    columns = _columns(base, overrides, grid, layout)
    out: dict[str, np.ndarray] = {}
    for mask, group in _groups(columns, shape, layout):
        specs = _specs(group)
        comp = compiled(specs.structure)
        values = symbol_values(specs.model, specs.train, specs.parallel, hw if layout else None)
        args = [np.asarray(values[s], dtype=np.float64) for s in EVAL_SYMBOLS]
        if quantities is None:
            results = dict(zip(comp.keys, comp.vector(*args), strict=True))
        else:
            keys = tuple(k for k in quantities if k in comp.keys)
            results = dict(zip(keys, compiled_subset(specs.structure, keys)(*args), strict=True))
        for key in comp.keys if quantities is None else quantities:
            if key in results:
                if mask is None:  # one structure: the grid as broadcast, no copies
                    out[key] = np.broadcast_to(np.asarray(results[key], np.float64), shape)
                    continue
                column = out.setdefault(key, np.full(points, np.nan))
                column[mask] = np.broadcast_to(results[key], (int(mask.sum()),))
    missing = [k for k in quantities or () if k not in out]
    if missing:
        raise SpecError("quantities", f"unknown quantity: {', '.join(missing)}")
    return {k: v if v.shape == shape else v.reshape(shape) for k, v in out.items()}


def _columns(
    base: ModelSpec, overrides: dict[str, Any], grid: dict[str, np.ndarray], layout: bool
) -> dict[str, np.ndarray]:
    """One array per field (broadcastable to the grid): the grid's, an override, or the
    spec's default."""
    par_defaults = ParallelSpec() if layout else None
    train_defaults = TrainSpec()
    cols: dict[str, np.ndarray] = {}
    for cls, names in _OWNERS.items():
        if cls is ParallelSpec and not layout:
            continue
        source = {ModelSpec: base, TrainSpec: train_defaults, ParallelSpec: par_defaults}[cls]
        for name in names:
            value = grid.get(name, overrides.get(name, getattr(source, name)))
            dtype = object if name in _KINDS or name == "name" else None
            cols[name] = np.asarray(value, dtype=dtype)
    _derive_heads(base, overrides, cols)
    return cols


def _derive_heads(base: ModelSpec, overrides: dict[str, Any], cols: dict[str, np.ndarray]):
    """Derived defaults follow what they derive from, as ``ModelSpec.replace`` does."""
    if "head_dim" not in overrides and {"d_model", "n_heads"} & set(overrides):
        cols["head_dim"] = derived_head_dim(cols["d_model"], cols["n_heads"])
    mha = base.n_kv_heads == base.n_heads
    if "n_kv_heads" not in overrides and "n_heads" in overrides and mha:
        cols["n_kv_heads"] = cols["n_heads"]


def _groups(cols: dict[str, np.ndarray], shape: tuple[int, ...], layout: bool):
    """(mask, {field: scalar kind or array of sizes}) per structure; mask None when the whole
    grid is one structure (the arrays then keep their broadcastable shapes)."""
    keys = [
        cols[k] for k in sorted(_KINDS) if k in cols and np.unique(cols[k].astype(str)).size > 1
    ]
    if layout:
        keys += [k for k in (cols["pp"] > 1, cols["pp_interleave"] > 1) if np.unique(k).size > 1]
    if not keys:
        yield None, {k: c.item() if k in _KINDS or k == "name" else c for k, c in cols.items()}
        return
    flat = {k: np.broadcast_to(c, shape).ravel() for k, c in cols.items()}
    codes = np.zeros(int(np.prod(shape)), dtype=np.int64)
    for key in keys:
        key = np.broadcast_to(key, shape).ravel()
        _, inverse = np.unique(key.astype(str) if key.dtype == object else key,
                               return_inverse=True)  # fmt: skip
        codes = codes * (int(inverse.max(initial=0)) + 1) + inverse.ravel()
    for code in np.unique(codes):
        mask = codes == code
        first = int(np.argmax(mask))
        group = {k: c[first] if k in _KINDS or k == "name" else c[mask] for k, c in flat.items()}
        yield mask, group


def _specs(group: dict[str, Any]) -> SimpleNamespace:
    """Checked specs of one structure group: real specs built from its first point check
    the kinds and flags; the specs' rules check every point's sizes."""
    first = {k: (v.flat[0] if isinstance(v, np.ndarray) else v) for k, v in group.items()}
    owned = {cls: {k: _plain(first[k]) for k in names} for cls, names in _OWNERS.items()
             if all(k in first for k in names)}  # fmt: skip
    model = ModelSpec(**owned[ModelSpec])
    train = TrainSpec(**owned[TrainSpec])
    par = ParallelSpec(**owned[ParallelSpec]) if ParallelSpec in owned else None
    m = SimpleNamespace(**{k: group[k] for k in _OWNERS[ModelSpec]})
    t = SimpleNamespace(**{k: group[k] for k in _OWNERS[TrainSpec]})
    model_rules(n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, head_dim=m.head_dim, pos=m.pos)
    train_rules(batch=t.batch, grad_accum=t.grad_accum)
    check_positions(m.pos, t.seq, m.max_positions)
    p = None
    if par is not None:
        p = SimpleNamespace(**{k: group[k] for k in _OWNERS[ParallelSpec]})
        layout_rules(p, m, seq=t.seq, batch=t.batch, grad_accum=t.grad_accum)
        cp_rule(p.cp, t.attention)
    return SimpleNamespace(model=m, train=t, parallel=p, structure=structure_of(model, train, par))


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones (the specs check Python types)."""
    return value.item() if isinstance(value, np.generic) else value
