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

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from costmodel.answers import as_fields
from costmodel.answers.serve import DEFAULT_HARDWARE, ServeAnswer, answer, spec_of
from costmodel.api.planning import plan as plan
from costmodel.api.sweeping import sweep as sweep
from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.hf import model_from_hf_config, model_from_hf_dict
from costmodel.catalog.presets import get_model
from costmodel.engine import estimate as _engine
from costmodel.engine import inverse
from costmodel.engine import plan as _plan
from costmodel.engine.caveats import caveats
from costmodel.engine.estimate import Estimate
from costmodel.engine.fit import budget_from, check_headroom
from costmodel.engine.sweep import Table as Table
from costmodel.engine.verdict import verdict as _verdict
from costmodel.inputs import (
    BY_KEY,
    build,
    expert_start,
    keyword_values,
    refuse_solved,
    solved_verdict,
)
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec

GB, GIB = 1e9, 2**30


def from_hf(config: str | Path | Mapping[str, Any]) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` (a path, or the parsed dict)."""
    if isinstance(config, Mapping):
        return model_from_hf_dict(dict(config), "the config dict")
    if not isinstance(config, str | Path):
        raise SpecError("config", "from_hf takes a config.json's path or its parsed dict (got "
                        f"{type(config).__name__})")  # fmt: skip
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
        hw = None if hardware is None else get_hardware(hardware)  # a name, path or Hardware
        if parallel is not None and not isinstance(parallel, ParallelSpec):
            raise SpecError("parallel", f"parallel must be a ParallelSpec (got a "
                            f"{type(parallel).__name__})")  # fmt: skip
        budget = {k: inputs.pop(k) for k in ("token_budget", "price_per_hour") if k in inputs}
        if inputs:
            raise SpecError(sorted(inputs)[0], "give inputs as keywords or specs, not both")
        if hw is not None and parallel is None:
            raise SpecError("hardware", "hardware prices a layout: give a ParallelSpec too "
                            "(ParallelSpec() for one device)")  # fmt: skip
        return _with_caveats(_engine.estimate(model, train, parallel, hw, **budget))
    if train is not None or parallel is not None:
        raise SpecError("train", "train and parallel must be a TrainSpec and a ParallelSpec")
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
    return _with_caveats(est)


def _with_caveats(est: Estimate) -> Estimate:
    """``est`` with the caveats of the CLI's verdict (none without a layout)."""
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
    if not isinstance(est, Estimate):
        raise SpecError("est", "verdict takes an Estimate, what costmodel.estimate returns "
                        f"(got {type(est).__name__}; serve's answer has its own fits, "
                        "nearest and caveats)")  # fmt: skip
    if est.parallel is None or est.hardware is None:
        raise SpecError("hardware", "a verdict needs hardware (and a layout)")
    out = _verdict(est, est.headroom, defaulted=est.defaulted, nearest=nearest, notes=est.notes)
    worded = ("summary", "limited_by", "layout", "assumptions")  # where the CLI names flags
    return {k: as_fields(v) if k in worded else v for k, v in out.items()}


def table(result: Mapping[str, Any] | _plan.Plan) -> Any:
    """A sweep's or a plan's rows as a pandas DataFrame when pandas is installed, else as
    a dict of flat numpy columns (inputs first, then quantities)."""
    if not isinstance(result, Mapping | _plan.Plan):
        raise SpecError("result", "table takes a sweep's result or a plan (got a value of type "
                        f"{type(result).__name__})")  # fmt: skip
    tab = result.table() if isinstance(result, _plan.Plan) else Table(result)
    try:
        return tab.frame()
    except ImportError:
        return tab.columns()


def serve(
    model: str | ModelSpec, hardware: str | Hardware | None = None, **inputs: Any
) -> ServeAnswer:
    """Serving ``model`` on ``hardware`` (``serve`` of the CLI, by its names without the
    dashes: ``context`` or ``input`` and ``output``, ``batch``, ``tp``, ``kv_dtype``,
    ``request_rate``, ...; the CLI's defaults): the estimate (memory, TTFT, TPOT,
    throughput; dict-like), whether the batch fits, the nearest change that fits when it
    does not, and the caveats (:class:`costmodel.answers.serve.ServeAnswer`). Without
    ``hardware``, the CLI's default device, said in the notes."""
    spec_model = model if isinstance(model, ModelSpec) else get_model(_preset(model))
    said = [f"hardware {DEFAULT_HARDWARE}, the default: set hardware"] * (hardware is None)
    hardware = DEFAULT_HARDWARE if hardware is None else hardware
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    try:
        spec = spec_of(inputs)
    except SpecError as err:  # the serve CLI's words, in this API's names
        raise SpecError(err.field, as_fields(str(err))) from None
    given = {k for k, v in inputs.items() if v is not None}
    defaulted = ("output" not in given and not {"context", "input"} <= given,
                 "batch" not in given, "engine" not in given)  # fmt: skip
    ans = answer(spec_model, spec, hw, defaulted)
    ans.estimate.notes[:0] = said
    return replace(ans, nearest=None if ans.nearest is None else as_fields(ans.nearest),
                   caveats=[as_fields(c) for c in ans.caveats], keywords=True)  # fmt: skip


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
    named = "budget_gib" if budget_gib is not None else "budget_gb"
    try:
        out = inverse.max_fitting(setup.model, setup.train, setup.parallel, setup.hardware,
                                  field, budget, headroom)  # fmt: skip
    except SpecError as err:  # the argument given, not the engine's field (a probe)
        if err.field != "budget":
            raise
        raise SpecError(named, err.message.replace("budget", named, 1)) from None
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
    batch_tokens: int | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    """``solve min-fsdp`` (the full model's answer): the smallest FSDP degree that fits,
    each device holding ``batch_tokens`` (default one sequence; whole sequences, rounded
    up) in one micro-batch, so the batch grows with the degree, with ``assumed``, what it
    held, in words; needs ``hardware``."""
    for chosen in ("gpus", "fsdp"):
        if chosen in inputs:
            raise SpecError(chosen, f"min_fsdp finds {chosen}: leave {chosen} out")
    for held in ("batch", "grad_accum", "microbatch"):  # as the CLI: one device's tokens
        if held in inputs:
            raise SpecError(held, "min_fsdp holds one device's tokens (batch_tokens, default "
                            f"one sequence) in one micro-batch: leave {held} out")  # fmt: skip
    if batch_tokens is not None:
        checks.integer("batch_tokens", batch_tokens, minimum=1)
    if inputs.get("hardware") is None:  # before the build, which names what needs it
        raise SpecError("hardware", "min_fsdp needs hardware (the full model's per-device "
                        "peak; solve min-fsdp prices the book's chip without it)")  # fmt: skip
    start = expert_start(inputs)  # a group the experts' split allows, searched from 1
    replicas = inputs.get("dp", 1) * start.get("fsdp", 1)  # the batch spans dp x fsdp devices
    per_device = 1
    while True:  # one sequence each, then the whole sequences batch_tokens asks at the seq
        values, spec = keyword_values(model, {**start, **inputs, "microbatch": per_device,
                                              "batch": per_device * replicas})  # fmt: skip
        setup = build(values, spec)
        held = -(-(batch_tokens or 1) // setup.train.seq)
        if held <= per_device:
            break
        per_device = held
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
