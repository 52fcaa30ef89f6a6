"""Vectorised evaluation: the same formulas as ``estimate`` over numpy grids.

Any ModelSpec, TrainSpec or ParallelSpec field may be an array; arrays broadcast together.
Grid points are grouped by *structure* (the kinds, flags and parallel features that change
the formulas' branches), each group is checked by the one rule table
(:func:`costmodel.config.check`) and evaluated by one call of the formulas on that group's
numpy arrays (``quantities.evaluated``), with symbol values from the same function
``estimate`` uses.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import numpy as np

from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.config import check
from costmodel.engine.estimate import symbol_values
from costmodel.engine.quantities import (
    MODEL_STRUCTURE,
    PARALLEL_STRUCTURE,
    TRAIN_STRUCTURE,
    evaluated,
    structure_of,
)
from costmodel.engine.threads import in_threads, threads_for
from costmodel.specs import checks
from costmodel.specs.checks import SpecError, UnknownKey, unknown
from costmodel.specs.frameworks import framework_defaults, own_stage
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import DERIVED, ModelSpec, TrainSpec, following
from costmodel.specs.parallel import ParallelSpec, expert_tp, grad_accum_of

_OWNERS = {cls: {f.name: f for f in fields(cls)} for cls in (ModelSpec, TrainSpec, ParallelSpec)}
_KINDS = {*MODEL_STRUCTURE, *TRAIN_STRUCTURE, *PARALLEL_STRUCTURE} - {"pipelined", "interleaved"}
"""Fields whose value changes the expressions: one value per structure group (pipelining
and interleaving are the degrees pp > 1 and pp_interleave > 1, grouped apart)."""


_WORDS = {name for owned in _OWNERS.values() for name, f in owned.items()
          if isinstance(f.default, str)} | _KINDS  # fmt: skip
"""Fields whose values are words (kinds, kernels, dispatchers): swept as Python objects."""

_MAY_BE_ZERO = ("n_experts", "experts_per_token", "n_shared_experts", "dense_layers",
                "sliding_window", "global_every")  # fmt: skip
"""Sizes a dense model leaves at 0 (ModelSpec's mixture-of-experts and window fields)."""


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray | list | tuple | range)


_REAL = {name for owned in _OWNERS.values() for name, f in owned.items()
         if str(f.type).startswith("float")} - _KINDS  # fmt: skip
"""Fields that are real numbers (bucket sizes, imbalance, capacity): checked by their own
rules, never rounded to integers."""


_FLAGS = {name for owned in _OWNERS.values() for name, f in owned.items()
          if isinstance(f.default, bool)} - _KINDS  # fmt: skip
"""Flags that only set a value (``capacity_pad``: the padded capacity), not a structure."""


def _as_grid(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if name in _WORDS:  # words as text (``factorize`` codes them), flags stay numeric
        return arr
    if name in _FLAGS:
        return arr.astype(bool)
    if name in _REAL:
        return arr.astype(float)
    if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
        arr = arr.astype(np.int64)
    checks.integer(name, arr, minimum=0 if name in _MAY_BE_ZERO else 1)
    return arr


REPR_ROWS = 10
"""Rows a Table's repr shows."""
REPR_COLUMNS = 12
"""Columns a Table's repr shows at most: beyond, :data:`REPR_PREFERRED` (a plan's rows)."""
REPR_PREFERRED = ("rank", "gpus", "label", "time_s.step", "tokens_per_s", "mfu",
                  "memory_bytes_per_device.peak", "fits", "tight", "limit")  # fmt: skip


def _cell(x: Any) -> str:
    if isinstance(x, float | np.floating):
        return f"{x:.4g}"
    return str(x)


class Table(dict):
    """Numpy arrays of one shape by name (a grid's inputs and quantities); :meth:`columns`
    flattens them, :meth:`frame` makes a pandas DataFrame (one row per grid point).
    ``inputs``: the names that are the grid's inputs (its repr shows those that vary)."""

    def __init__(self, data: Any = (), inputs: tuple[str, ...] = ()) -> None:
        super().__init__(data)
        self.inputs = inputs

    def __missing__(self, key: str) -> Any:
        """A name no column has: the closest names, as an estimate's ``[]`` says them."""
        raise UnknownKey(key, unknown("column", key, self, "table.keys() lists them"))

    def columns(self) -> dict[str, np.ndarray]:
        """Every array flattened to one column (the rows of the grid, C order)."""
        return {k: np.asarray(v).ravel() for k, v in self.items()}

    def __repr__(self) -> str:
        """The first rows as text, one column per name (numbers to 4 significant digits)."""
        cols = self.columns()
        rows, every = len(next(iter(cols.values()), ())), len(cols)
        if every > REPR_COLUMNS:  # the inputs that vary, then what ranks a plan's rows
            varied = [k for k in self.inputs if k in cols and len(np.unique(cols[k])) > 1]
            cols = {k: cols[k] for k in (*varied, *REPR_PREFERRED) if k in cols} or dict(
                list(cols.items())[:REPR_COLUMNS]
            )
        shown = {k: [_cell(x) for x in v[:REPR_ROWS]] for k, v in cols.items()}
        widths = {k: max(len(k), *(len(c) for c in v), 1) for k, v in shown.items()}
        lines = ["  ".join(k.rjust(widths[k]) for k in shown)]
        for i in range(min(rows, REPR_ROWS)):
            lines.append("  ".join(shown[k][i].rjust(widths[k]) for k in shown))
        more = f"\n... {rows - REPR_ROWS:,} more rows (.frame() or .columns())" * (rows > REPR_ROWS)
        some = f" ({len(cols)} shown; .frame() or .columns() for all)" * (every > len(cols))
        return f"Table of {rows:,} rows x {every} columns{some}\n" + "\n".join(lines) + more

    def frame(self) -> Any:
        """The columns as a pandas DataFrame (pandas is optional: ``pip install pandas``)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Table.frame() needs pandas (pip install pandas); "
                              "Table.columns() gives numpy columns") from None  # fmt: skip
        return pd.DataFrame(self.columns())


def sweep(
    model: str | ModelSpec = "cs336-2.7b",
    *,
    hardware: str | Hardware | None = None,
    quantities: Iterable[str] | None = None,
    checked: bool = False,
    **overrides: Any,
) -> dict[str, np.ndarray]:
    """Every quantity over a broadcast grid of spec fields.

    ``overrides`` are ModelSpec, TrainSpec or ParallelSpec fields, scalars or arrays (and
    ``micro_batch``, sequences per device per micro-batch, in place of ``grad_accum``). With
    ``hardware`` (or any ParallelSpec field, which needs it) the layout's per-device
    memory, time and MFU are included. Returns float64 arrays keyed like ``estimate``;
    a quantity that only some structures have (e.g. what full recomputation keeps) is NaN
    where it does not apply. ``checked``: the caller has checked every point with
    ``config.check`` (the planner's candidates), which each group then skips.
    """
    quantities = None if quantities is None else list(quantities)
    if "micro_batch" in overrides:
        overrides = _micro_batch_to_grad_accum(dict(overrides))
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
    known: list[tuple] = []  # the quantities a structure of the grid has
    lock = threading.Lock()

    def group_numbers(item: tuple[Any, dict[str, Any]]) -> None:
        """One structure group, picked, evaluated and written into ``out`` (in a worker
        thread: its points are its own, so writers never meet)."""
        idx, flat = item
        group = flat if idx is None else {k: _pick(c, idx, k in _WHOLE) for k, c in flat.items()}
        specs = _specs(group, checked)
        values = symbol_values(specs.model, specs.train, specs.parallel, hw if layout else None)
        numbers = evaluated(specs.structure, {k: _floats(v) for k, v in values.items()})
        known.append(tuple(numbers))
        keys = tuple(numbers) if quantities is None else tuple(
            k for k in quantities if k in numbers)  # fmt: skip
        for key in keys:
            result = np.asarray(numbers[key], np.float64)
            if idx is None:  # one structure: the grid as broadcast, no copies
                out[key] = np.broadcast_to(result, shape)
                continue
            if key not in out:
                with lock:
                    out.setdefault(key, np.full(points, np.nan))
            out[key][idx] = result

    threads = threads_for(points)
    for _ in in_threads(group_numbers, _groups(columns, shape, layout), threads):
        pass  # in order: the first group that raises raises here
    missing = [k for k in quantities or () if k not in out]
    if missing:  # named with the closest keys a structure of the grid has
        said = checks.unknown("quantity", missing[0], known[0],
                              "estimate(...).keys() lists them")  # fmt: skip
        raise SpecError("quantities", said)
    return {k: v if v.shape == shape else v.reshape(shape) for k, v in out.items()}


def _floats(value: Any) -> Any:
    """A symbol's value as the formulas compute on it: float64 arrays, and a value alike
    at every point as a Python float (numpy's 0-d arithmetic costs ~10x Python's)."""
    array = np.asarray(value, dtype=np.float64)
    return float(array) if array.ndim == 0 else array


def _micro_batch_to_grad_accum(overrides: dict[str, Any]) -> dict[str, Any]:
    """``grad_accum = batch / (dp * fsdp * micro_batch)``, checked to divide exactly."""
    if "grad_accum" in overrides:
        raise SpecError("micro_batch", "give micro_batch or grad_accum, not both")
    mb = _as_grid("micro_batch", overrides.pop("micro_batch"))
    batch = np.asarray(overrides.get("batch", TrainSpec().batch))
    dp, fsdp = overrides.get("dp", 1), overrides.get("fsdp", 1)
    overrides["grad_accum"] = np.asarray(grad_accum_of(batch, dp, fsdp, mb, field="micro_batch"))
    return overrides


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
            value = np.asarray(grid.get(name, overrides.get(name, getattr(source, name))))
            cols[name] = value
    given = {k: grid.get(k, v) for k, v in overrides.items()}
    cols.update({k: np.asarray(v) for k, v in following(base, given).items()})
    # a field the base left unset (a dense preset's expert width) is derived as a spec
    # built with it would be: a sweep that makes the preset MoE had NaN there (a probe)
    for name, sources, rule in DERIVED:
        if cols[name].dtype == object and all(v is None for v in cols[name].flat):
            cols[name] = np.asarray(rule(*(cols[s] for s in sources)))
    if layout:  # fields left to each framework's own default
        stated = {k for k, v in {**overrides, **grid}.items() if v is not None}
        cols.update(framework_defaults(cols["framework"], stated))
        if "zero" not in stated:  # each framework's own stage over each fsdp
            cols["zero"] = np.asarray(own_stage(cols["framework"], cols["fsdp"]))
        cols["etp"] = expert_tp(cols["tp"], cols["etp"] if "etp" in stated else None)
    return cols


def _groups(cols: dict[str, np.ndarray], shape: tuple[int, ...], layout: bool):
    """(indices, the grid's flat columns) per structure, each group's part of them taken
    by :func:`_pick` where it is evaluated; (None, {field: scalar kind or array of sizes})
    when the whole grid is one structure (the arrays then keep their broadcastable shapes).
    Fields that are one value for the whole grid stay scalars."""
    keys = [cols[k] for k in sorted(_KINDS) if k in cols and cols[k].size > 1]
    if layout:
        keys += [cols["pp"] > 1, cols["pp_interleave"] > 1]
    for size in ("n_experts", "kv_lora_rank", "q_lora_rank", "sliding_window", "global_every"):
        if cols[size].size > 1:  # blocks differ with and without experts, MLA, its query
            keys.append(cols[size] > 0)  # rank, a window, a pattern of windows
    codes = np.zeros(int(np.prod(shape)), dtype=np.int64)
    for key in keys:
        inverse, n = factorize(np.broadcast_to(key, shape).ravel())
        codes = codes * n + inverse
    small = codes.astype(np.uint16) if codes.max(initial=0) < 2**16 else codes
    order = np.argsort(small, kind="stable")  # radix sort for 16-bit keys
    ordered = small[order]
    starts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1  # where each group begins
    if starts.size == 0:
        yield None, {k: c.flat[0] if k in _WHOLE else c for k, c in cols.items()}
        return
    flat = {k: np.broadcast_to(c, shape).ravel() if c.size > 1 else c.reshape(())
            for k, c in cols.items()}  # fmt: skip
    for start, end in zip([0, *starts], [*starts, codes.size], strict=True):
        yield order[start:end], flat


_WHOLE = _KINDS | {"name"}
"""Fields a structure group reads as one value (all alike in it)."""


def _pick(column: np.ndarray, idx: np.ndarray, kind: bool) -> Any:
    """A group's part of a column: its one value for a kind (all alike in a group), the
    selected sizes otherwise; a grid-wide scalar as it is."""
    if kind:
        return column.flat[idx[0] if column.ndim else 0]
    return column[idx] if column.ndim else column


_WORDS_COMPARED = 16
"""Words a column of text is coded by comparing (past this many, by sorting)."""


def factorize(values: np.ndarray) -> tuple[np.ndarray, int]:
    """(code of each element, a bound n with every code < n); text (choices such as
    frameworks) by comparing with each of its few distinct words, object arrays through a
    dict of them: both far faster than sorting strings."""
    if values.dtype.kind in "biu" and values.size:  # flags and stages: offsets, no sort
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < 4096:
            return (values - lo).astype(np.int64), hi - lo + 1
    if values.dtype.kind in "US" and values.size:  # a few words: a compare per word
        flat, codes = values.ravel(), np.full(values.size, -1, np.int64)
        for n in range(_WORDS_COMPARED + 1):
            at = int(np.argmin(codes))  # the first word not yet coded
            if codes[at] >= 0:
                return codes, n
            if n < _WORDS_COMPARED:
                codes[flat == flat[at]] = n
    if values.dtype != object:
        _, inverse = np.unique(values, return_inverse=True)
        return inverse.ravel().astype(np.int64), int(inverse.max(initial=0)) + 1
    items = values.tolist()
    index = {v: i for i, v in enumerate(dict.fromkeys(items))}
    return np.fromiter(map(index.__getitem__, items), np.int64, len(items)), len(index)


def _specs(group: dict[str, Any], checked: bool = False) -> SimpleNamespace:
    """Checked specs of one structure group: real specs built from its first point check
    the kinds and flags; the specs' rules check every point's sizes (unless ``checked``)."""
    first = {k: (v.flat[0] if isinstance(v, np.ndarray) else v) for k, v in group.items()}
    owned = {cls: {k: _plain(first[k]) for k in names} for cls, names in _OWNERS.items()
             if all(k in first for k in names)}  # fmt: skip
    model = ModelSpec(**owned[ModelSpec])
    train = TrainSpec(**owned[TrainSpec])
    par = ParallelSpec(**owned[ParallelSpec]) if ParallelSpec in owned else None
    m = SimpleNamespace(**{k: group[k] for k in _OWNERS[ModelSpec]})
    t = SimpleNamespace(**{k: group[k] for k in _OWNERS[TrainSpec]})
    p = None
    if par is not None:
        p = SimpleNamespace(**{k: group[k] for k in _OWNERS[ParallelSpec]})
    if not checked:
        check(m, t, p)
    return SimpleNamespace(model=m, train=t, parallel=p, structure=structure_of(model, train, par))


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones (the specs check Python types)."""
    return value.item() if isinstance(value, np.generic) else value
