"""``costmodel.sweep``: any spec field as an array, with the CLI's inputs (``gpus``,
``microbatch``) as ``estimate`` takes them and a device ``fits`` column."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from costmodel.catalog.hardware import get_hardware
from costmodel.engine import sweep as _sweep
from costmodel.engine.fit import PEAK, RESERVED, budget_bytes, check_headroom, fits
from costmodel.engine.sweep import Table
from costmodel.inputs import default_batch
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec


def _fill_gpus(gpus: Any, given: dict[str, Any]) -> dict[str, Any]:
    """``gpus`` as the CLI takes it: the data-parallel devices fill what tp, pp, cp (and
    fsdp given) leave, as one shard group (fsdp) where the framework shards by default and
    neither dp nor fsdp is given, else as replicas (dp); a dp given is the layout's, which
    gpus must equal (``estimate``'s rule)."""
    gpus = np.asarray(gpus)
    checks.integer("gpus", gpus)
    framework = given.get("framework", ParallelSpec().framework)
    shard = "dp" not in given and "fsdp" not in given
    shard = np.asarray(trait(np.asarray(framework, dtype=object), "shards_by_default")) & shard
    other = np.ones((), dtype=np.int64)
    for name in ("tp", "pp", "cp", "dp", "fsdp"):
        other = other * np.asarray(given.get(name, 1))
    if np.any(gpus % other):
        raise SpecError("gpus", "dp * fsdp * tp * pp * cp must divide gpus")
    rest = gpus // other
    if "dp" in given:  # as estimate: a dp given is the layout's, which gpus must equal
        if np.any(rest != 1):
            raise SpecError("gpus", "dp * fsdp * tp * pp * cp must equal gpus (dp given: "
                            "give fsdp too for a hybrid layout, or leave dp out)")  # fmt: skip
        return {}
    if "fsdp" in given:
        return {"dp": rest}
    return {"fsdp": np.where(shard, rest, 1), "dp": np.where(shard, 1, rest)}


def sweep(
    model: str | ModelSpec | None = None,
    *,
    hardware: str | Hardware | None = None,
    quantities: Iterable[str] | None = None,
    gpus: Any = None,
    microbatch: Any = None,
    memory_headroom: float | None = None,
    **overrides: Any,
) -> Table:
    """Quantities over a broadcast grid of spec fields, with the inputs as columns.

    ``overrides`` are ModelSpec, TrainSpec or ParallelSpec fields, scalars or arrays (see
    ``engine.sweep.sweep``); ``gpus`` fills dp (or fsdp under a framework that shards by
    default) as the CLI does, and ``microbatch`` (sequences per device per micro-batch;
    ``micro_batch``, the engine's name, the same) sets grad_accum (1 unless grad_accum is
    given, as ``estimate`` and the CLI). Returns a :class:`Table`: every input given (with
    the dp, fsdp and micro-batch that gpus gave), then every quantity, as arrays of the
    grid's shape, and with a device ``fits`` (the fit rule of ``estimate``'s verdict: a
    row's times are what it would take if it fitted; ``memory_headroom`` as estimate's)
    (``.frame()`` for pandas,
    ``costmodel.table(result)`` for either)."""
    if model is None:  # no silent default model (it was cs336-2.7b): estimate needs one too
        raise SpecError("model", "sweep needs a model: a preset name or a ModelSpec first")
    _one("model", model, (str, ModelSpec), "a preset name or a ModelSpec", "call once per model")
    _one("hardware", hardware, (str, Hardware, type(None)), "a catalog name or a Hardware",
         "call once per device (the CLI's plan --hardware a,b compares devices)")  # fmt: skip
    if isinstance(quantities, str):  # one quantity by name, not its characters
        quantities = [quantities]
    grid = dict(overrides)
    _check_broadcast({**grid, **({"gpus": gpus} if gpus is not None else {})})
    if gpus is not None:
        grid.update(_fill_gpus(gpus, grid))
    if "batch" not in grid and ("dp" in grid or "fsdp" in grid):  # estimate's default batch
        ranks = np.asarray(grid.get("dp", 1)) * np.asarray(grid.get("fsdp", 1))
        grid["batch"] = default_batch(TrainSpec().batch, ranks)
    if gpus is not None:
        hardware = hardware or _required("gpus")
    shown = microbatch is not None or gpus is not None  # a column where given or gpus chose
    if microbatch is None and "grad_accum" not in grid and "micro_batch" not in grid:
        microbatch = _one_sequence(grid)  # estimate's default; micro_batch, given, is kept
    if microbatch is not None:
        if "micro_batch" in grid:
            raise SpecError("micro_batch", "give microbatch or micro_batch, not both")
        grid["micro_batch"] = microbatch
    asked = None if quantities is None else list(quantities)
    if asked is not None and hardware is not None:  # the fit rule's inputs: every row says
        quantities = [*asked, *(k for k in (PEAK, RESERVED) if k not in asked)]  # if it fits
    if gpus is not None and "batch" in grid:  # named by gpus, which chose the ranks
        ranks = np.asarray(grid.get("dp", 1)) * np.asarray(grid.get("fsdp", 1))
        batch = np.asarray(grid["batch"])
        shape = np.broadcast_shapes(np.shape(batch), np.shape(ranks), np.shape(gpus))
        bad = np.broadcast_to(batch % ranks != 0, shape)
        if bad.any():
            at = np.unravel_index(int(np.argmax(bad)), shape)
            g, r, b = (np.broadcast_to(x, shape)[at] for x in (gpus, ranks, batch))
            raise SpecError("gpus", f"gpus {g} leave {r} data-parallel ranks (dp * fsdp), "
                            f"which do not divide batch {b}")  # fmt: skip
    try:
        out = _sweep.sweep(model, hardware=hardware, quantities=quantities, **grid)
    except SpecError as err:  # the engine's micro_batch is the API's microbatch
        if err.field != "micro_batch" or "micro_batch" in overrides:
            raise
        raise SpecError("microbatch", err.message.replace("micro_batch", "microbatch")) from None
    inputs = {**overrides, **({"gpus": gpus} if gpus is not None else {})}
    if microbatch is not None and shown:
        inputs["microbatch"] = microbatch
    inputs.update({k: grid[k] for k in ("dp", "fsdp", "batch") if k in grid})
    shape = np.broadcast_shapes(*(np.shape(v) for v in out.values()))
    cols = {k: np.broadcast_to(np.asarray(v), shape) for k, v in inputs.items()}
    if hardware is not None and PEAK in out:  # the fit rule, as estimate's verdict
        hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
        allowed = budget_bytes(hw, None if memory_headroom is None
                               else check_headroom(memory_headroom))  # as estimate's  # fmt: skip
        ok = np.broadcast_to(np.asarray(fits(out, allowed)), shape)
        out["fits"] = ok
        out["tight"] = ok & (np.broadcast_to(np.asarray(out[RESERVED]), shape) > hw.hbm_bytes)
        for key in (PEAK, RESERVED):
            if asked is not None and key not in asked:
                del out[key]
    return Table({**cols, **out}, inputs=tuple(cols))


def _one(field: str, value: Any, types: tuple[type, ...], what: str, instead: str) -> None:
    """One model or device per call: a list of them is refused, naming the field (a sweep
    varies spec fields) and what to do ``instead``."""
    if not isinstance(value, types):
        raise SpecError(field, f"{field} must be {what}, one per call (got "
                        f"{type(value).__name__}): {instead}")  # fmt: skip


def _check_broadcast(grid: dict[str, Any]) -> None:
    """Arrays of the grid numpy can broadcast together, or one line naming two that do not."""
    empty = next((k for k, v in grid.items() if np.ndim(v) and np.size(v) == 0), None)
    if empty is not None:
        raise SpecError(empty, f"{empty} is an empty list: give at least one value")
    shaped = [(k, np.shape(v)) for k, v in grid.items() if np.ndim(v)]
    try:
        np.broadcast_shapes(*(shape for _, shape in shaped))
    except ValueError:
        pairs = [(x, y) for i, x in enumerate(shaped) for y in shaped[i + 1 :]]
        (a, sa), (b, sb) = next((p for p in pairs if not _broadcasts(p[0][1], p[1][1])), pairs[0])
        raise SpecError(a, f"{a} (shape {sa}) and {b} (shape {sb}) do not broadcast: give "
                        f"arrays of one length, or crossed shapes (e.g. np.array({a})[:, "
                        "None])") from None  # fmt: skip


def _broadcasts(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _one_sequence(grid: dict[str, Any]) -> int | None:
    """1 (one sequence per device per micro-batch, as ``inputs.build`` takes it)
    where the batch divides over the data-parallel devices everywhere, else None."""
    batch = np.asarray(grid.get("batch", TrainSpec().batch))
    ranks = np.asarray(grid.get("dp", 1)) * np.asarray(grid.get("fsdp", 1))
    return 1 if np.all(batch % ranks == 0) else None


def _required(field: str) -> str:
    raise SpecError("hardware", f"hardware is required with {field}")
