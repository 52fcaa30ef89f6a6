"""The notebook surface: the CLI's questions as functions, with the CLI's names and units.

Each function takes a preset name (or a :class:`ModelSpec`, e.g. from :func:`from_hf`) and
the inputs of ``costmodel.inputs.INPUTS`` as keywords, spelled as the CLI's flags without
the dashes (``hardware="h100-sxm"``, ``gpus=8``, ``microbatch=1``, ``framework="fsdp2"``),
and goes through :func:`costmodel.inputs.build`, so every default and rule is the CLI's
and the app's. A misspelled or unknown name is a ``SpecError`` naming it. Memory budgets
are ``budget_gb`` (1e9 bytes) or ``budget_gib`` (2^30 bytes), as ``solve --budget-gb``.

    >>> est = estimate("llama3-8b", hardware="h100-sxm", gpus=8, seq=8192, batch=64,
    ...                framework="fsdp2")                      # doctest: +SKIP
    >>> est["time_s.step"], est.fit().fits                     # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.answers.serve import ServeAnswer, answer, spec_of
from costmodel.api.planning import plan as plan
from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.hf import model_from_hf_config, model_from_hf_dict
from costmodel.catalog.presets import get_model
from costmodel.engine import estimate as _engine
from costmodel.engine import inverse
from costmodel.engine import plan as _plan
from costmodel.engine import sweep as _sweep
from costmodel.engine.caveats import caveats
from costmodel.engine.estimate import Estimate
from costmodel.engine.fit import (
    PEAK,
    RESERVED,
    budget_bytes,
    budget_from,
    check_headroom,
    fits,
)
from costmodel.engine.sweep import Table
from costmodel.engine.verdict import verdict as _verdict
from costmodel.inputs import (
    BY_KEY,
    build,
    default_batch,
    keyword_values,
    refuse_solved,
    solved_verdict,
)
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec

GB, GIB = 1e9, 2**30


def from_hf(config: str | Path | Mapping[str, Any]) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` (a path, or the parsed dict)."""
    if isinstance(config, Mapping):
        return model_from_hf_dict(dict(config))
    return model_from_hf_config(config)


def estimate(
    model: str | ModelSpec,
    train: TrainSpec | None = None,
    parallel: ParallelSpec | None = None,
    hardware: str | Hardware | None = None,
    **inputs: Any,
) -> Estimate:
    """One configuration's every quantity (seconds, bytes, FLOPs; exact ints for counts).

    Either specs, as ``engine.estimate.estimate`` takes them (``estimate(model, TrainSpec(..),
    ParallelSpec(..), "h100-sxm")``), or a preset name / ModelSpec with the CLI's inputs as
    keywords (``estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64)``): what is
    not given is taken as the CLI takes it, and said in ``Estimate.notes``."""
    if isinstance(train, TrainSpec):
        if not isinstance(model, ModelSpec):
            raise SpecError("model", "with a TrainSpec, give a ModelSpec (get_model(name))")
        hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
        budget = {k: inputs.pop(k) for k in ("token_budget", "price_per_hour") if k in inputs}
        if inputs:
            raise SpecError(sorted(inputs)[0], "give inputs as keywords or specs, not both")
        return _engine.estimate(model, train, parallel, hw, **budget)
    if train is not None or parallel is not None:
        raise SpecError("train", "train and parallel must be a TrainSpec and a ParallelSpec")
    if isinstance(hardware, Hardware):
        raise SpecError("hardware", "with keyword inputs, name the hardware (or give specs)")
    headroom = inputs.pop("memory_headroom", None)
    values, spec = keyword_values(model, {**inputs, "hardware": hardware})
    setup = build(values, spec)
    est = setup.estimate()
    if headroom is not None:
        if est.parallel is None:
            raise SpecError("memory_headroom", "memory_headroom needs hardware (a device)")
        headroom = check_headroom(headroom)
    est = replace(
        est,
        notes=tuple(as_fields(n) for n in setup.notes),
        headroom=headroom,
        defaulted=frozenset(set(BY_KEY) - {k for k, v in values.items() if v is not None}),
    )
    if est.parallel is None:
        return est
    fitting = est.fit().fits  # the CLI's verdict leaves MFU's caveat out where nothing runs
    return replace(est, caveats=tuple(caveats(est, skip=() if fitting else ("mfu",))))


def verdict(est: Estimate, *, nearest: bool = True) -> dict[str, Any]:
    """The CLI's answer to ``estimate`` (its ``--json``'s ``verdict``) for an estimate of
    this API: fits or not and the memory rule's numbers; when it fits, step time, tokens/s
    per device, MFU and what limits the step (``limited_by``); when not (and ``nearest``),
    the nearest change that fits, from the planner's search (``nearest_fit``: its inputs,
    in the API's names); the layout, the assumptions (defaults named), what the device's
    numbers rest on, the caveats and the notes."""
    if est.parallel is None or est.hardware is None:
        raise SpecError("hardware", "a verdict needs hardware (and a layout)")
    out = _verdict(est, est.headroom, defaulted=est.defaulted, nearest=nearest, notes=est.notes)
    worded = ("summary", "limited_by", "layout", "assumptions")  # where the CLI names flags
    return {k: as_fields(v) if k in worded else v for k, v in out.items()}


def table(result: Mapping[str, Any] | _plan.Plan) -> Any:
    """A sweep's or a plan's rows as a pandas DataFrame when pandas is installed, else as
    a dict of flat numpy columns (inputs first, then quantities)."""
    tab = result.table() if isinstance(result, _plan.Plan) else Table(result)
    try:
        return tab.frame()
    except ImportError:
        return tab.columns()


def _fill_gpus(gpus: Any, given: dict[str, Any]) -> dict[str, Any]:
    """``gpus`` as the CLI takes it: the data-parallel devices fill what tp, pp, cp (and
    the degree given) leave, as one shard group (fsdp) where the framework shards by
    default and neither dp nor fsdp is given, else as replicas (dp)."""
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
    if "dp" in given and "fsdp" in given:
        if np.any(rest != 1):
            raise SpecError("gpus", "dp * fsdp * tp * pp * cp must equal gpus")
        return {}
    if "dp" in given:
        return {"fsdp": rest}
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
    **overrides: Any,
) -> Table:
    """Quantities over a broadcast grid of spec fields, with the inputs as columns.

    ``overrides`` are ModelSpec, TrainSpec or ParallelSpec fields, scalars or arrays (see
    ``engine.sweep.sweep``); ``gpus`` fills dp (or fsdp under a framework that shards by
    default) as the CLI does, and ``microbatch`` (sequences per device per micro-batch;
    ``micro_batch``, the engine's name, the same) sets grad_accum (with ``gpus``, 1 unless
    grad_accum is given, as the CLI). Returns a :class:`Table`: every input given (with
    the dp, fsdp and micro-batch that gpus gave), then every quantity, as arrays of the
    grid's shape, and with a device ``fits`` (the fit rule of ``estimate``'s verdict: a
    row's times are what it would take if it fitted) (``.frame()`` for pandas,
    ``costmodel.table(result)`` for either)."""
    if model is None:  # no silent default model (it was cs336-2.7b): estimate needs one too
        raise SpecError("model", "sweep needs a model: a preset name or a ModelSpec first")
    _one("model", model, (str, ModelSpec), "a preset name or a ModelSpec", "call once per model")
    _one("hardware", hardware, (str, Hardware, type(None)), "a catalog name or a Hardware",
         "call once per device, or plan(hardware=...) compares devices")  # fmt: skip
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
        if microbatch is None and "grad_accum" not in grid and "micro_batch" not in grid:
            microbatch = _one_sequence(grid)  # the engine's micro_batch, given, is kept
    if microbatch is not None:
        if "micro_batch" in grid:
            raise SpecError("micro_batch", "give microbatch or micro_batch, not both")
        grid["micro_batch"] = microbatch
    asked = None if quantities is None else list(quantities)
    if asked is not None and hardware is not None:  # the fit rule's inputs: every row says
        quantities = [*asked, *(k for k in (PEAK, RESERVED) if k not in asked)]  # if it fits
    out = _sweep.sweep(model, hardware=hardware, quantities=quantities, **grid)
    inputs = {**overrides, **({"gpus": gpus} if gpus is not None else {})}
    if microbatch is not None:
        inputs["microbatch"] = microbatch
    inputs.update({k: grid[k] for k in ("dp", "fsdp", "batch") if k in grid})
    shape = np.broadcast_shapes(*(np.shape(v) for v in out.values()))
    cols = {k: np.broadcast_to(np.asarray(v), shape) for k, v in inputs.items()}
    if hardware is not None and PEAK in out:  # the fit rule, as estimate's verdict
        hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
        ok = np.broadcast_to(np.asarray(fits(out, budget_bytes(hw))), shape)
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
    """1 (one sequence per device per micro-batch, as ``inputs.build`` takes it with gpus)
    where the batch divides over the data-parallel devices everywhere, else None."""
    batch = np.asarray(grid.get("batch", TrainSpec().batch))
    ranks = np.asarray(grid.get("dp", 1)) * np.asarray(grid.get("fsdp", 1))
    return 1 if np.all(batch % ranks == 0) else None


def _required(field: str) -> str:
    raise SpecError("hardware", f"hardware is required with {field}")


def serve(
    model: str | ModelSpec, hardware: str | Hardware = "h100-sxm", **inputs: Any
) -> ServeAnswer:
    """Serving ``model`` on ``hardware`` (``serve`` of the CLI, by its names without the
    dashes: ``context`` or ``input`` and ``output``, ``batch``, ``tp``, ``kv_dtype``,
    ``request_rate``, ...; the CLI's defaults): the estimate (memory, TTFT, TPOT,
    throughput; dict-like), whether the batch fits, the nearest change that fits when it
    does not, and the caveats (:class:`costmodel.answers.serve.ServeAnswer`)."""
    spec_model = model if isinstance(model, ModelSpec) else get_model(_preset(model))
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    try:
        spec = spec_of(inputs)
    except SpecError as err:  # the serve CLI's words, in this API's names
        raise SpecError(err.field, as_fields(str(err))) from None
    ans = answer(spec_model, spec, hw)
    return replace(ans, nearest=None if ans.nearest is None else as_fields(ans.nearest))


def _preset(model: Any) -> str:
    if not isinstance(model, str):
        raise SpecError("model", f"a preset name or a ModelSpec (got {type(model).__name__})")
    return model


def max_batch(
    model: str | ModelSpec,
    *,
    budget_gb: float | None = None,
    budget_gib: float | None = None,
    memory_headroom: float | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """``solve max-batch``: the largest batch (sequences) that fits, with ``budget_bytes``
    (None, and a ``reason``, where even the smallest batch of the layout does not fit)."""
    return _max_fitting("batch", model, budget_gb, budget_gib, memory_headroom, inputs)


def max_seq(
    model: str | ModelSpec,
    *,
    budget_gb: float | None = None,
    budget_gib: float | None = None,
    memory_headroom: float | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """``solve max-seq``: the longest sequence (tokens) that fits, with ``budget_bytes``
    (None, and a ``reason``, where even the shortest the layout allows does not fit)."""
    return _max_fitting("seq", model, budget_gb, budget_gib, memory_headroom, inputs)


def _max_fitting(field, model, budget_gb, budget_gib, headroom, inputs) -> dict[str, Any]:
    refuse_solved(field, inputs)
    values, spec = keyword_values(model, inputs)
    setup = build(values, spec, solving=field)
    if setup.parallel is None or setup.hardware is None:
        raise SpecError("hardware", f"max {field} needs hardware (and a layout)")
    budget = budget_from(budget_gb, budget_gib, headroom)
    out = inverse.max_fitting(setup.model, setup.train, setup.parallel, setup.hardware,
                              field, budget, headroom)  # fmt: skip
    if out[field] is not None:
        train = setup.train.replace(**{field: out[field]})
        out["verdict"] = _verdict_at(setup, train, setup.parallel, values, headroom, budget)
    return out


def _verdict_at(setup, train, par, values, headroom, budget) -> dict[str, Any]:
    """The verdict ``solve`` prints at a solved answer (``inputs.solved_verdict``)."""
    at = _engine.estimate(setup.model, train, par, setup.hardware)
    return solved_verdict(at, values, headroom, budget)


def min_fsdp(
    model: str | ModelSpec,
    *,
    budget_gb: float | None = None,
    budget_gib: float | None = None,
    memory_headroom: float | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """``solve min-fsdp`` (the full model's answer): the smallest FSDP degree that fits,
    each device keeping its micro-batch (default one sequence; ``batch`` beyond it is
    accumulated), with ``assumed``, what it held, in words; needs ``hardware``."""
    varied = {"gpus", "fsdp", "grad_accum", "microbatch"} & set(inputs)
    if varied:
        raise SpecError(sorted(varied)[0], "min_fsdp varies the FSDP degree: give batch only")
    values, spec = keyword_values(model, {"batch": 1, **inputs})
    setup = build(values, spec)
    if setup.parallel is None or setup.hardware is None:
        raise SpecError("hardware", "min_fsdp needs hardware")
    budget = budget_from(budget_gb, budget_gib, memory_headroom)
    out = inverse.min_fsdp_fitting(setup.model, setup.train, setup.parallel, setup.hardware,
                                   budget, headroom=memory_headroom)  # fmt: skip
    out["assumed"] = inverse.held_fixed(setup.train, setup.parallel, "fsdp")
    if out["fsdp"] is None:
        out["reason"] = out["why"]
        return out
    par = setup.parallel.replace(fsdp=out["fsdp"])
    batch = par.batch_step(setup.train.grad_accum) * out["micro_batch_per_device"]
    train = setup.train.replace(batch=batch)
    out["verdict"] = _verdict_at(setup, train, par, values, memory_headroom, budget)
    return out


def solve(question: str, model: str | ModelSpec, **inputs: Any) -> dict[str, Any]:
    """The CLI's ``solve QUESTION``: ``max-batch``, ``max-seq`` or ``min-fsdp``."""
    questions = {"max-batch": max_batch, "max-seq": max_seq, "min-fsdp": min_fsdp}
    checks.choice("question", question, tuple(questions))
    return questions[question](model, **inputs)


def as_fields(text: str) -> str:
    """A note in the API's words: the CLI's flags (``--grad-accum``) as the keyword names a
    call takes (``grad_accum``)."""
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), text)
