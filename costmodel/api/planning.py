"""``costmodel.plan``: the CLI's ``plan`` as a function, with its names and answers.

The CLI's search options under their Python names (``--max-gpus`` as ``max_gpus``,
``--micro-batches`` as ``microbatches``, ``--ep-dispatchers`` as ``ep_dispatchers``,
``--objective``), the model and training inputs as ``estimate`` takes them; what the
planner searches (the degrees, the micro-batch) is refused by name, as the CLI has no flag
for it. The returned :class:`~costmodel.engine.plan.Plan` ranks, explains its ranking and,
where nothing fits, says why (:func:`~costmodel.engine.plan.no_fit_text`) and names the
nearest layout that does (``Plan.nearest``), as the CLI does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from costmodel.catalog.hardware import get_hardware
from costmodel.engine import plan as _plan
from costmodel.engine.caveats import plan_caveats
from costmodel.engine.fit import DEFAULT_HEADROOM
from costmodel.engine.layouts import batch_choices, device_counts, token_batches
from costmodel.engine.why import nearest_fitting
from costmodel.inputs import build, keyword_values
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec

SEARCHED = ("dp", "fsdp", "tp", "pp", "cp", "ep", "etp", "zero", "pp_interleave",
            "sequence_parallel", "grad_accum", "microbatch")  # fmt: skip
"""Inputs the planner searches: refused as inputs of ``plan`` (the CLI has no flag)."""
SIZING = ("token_budget", "price_per_hour", "deadline_days", "checkpoint_gbps",
          "failures_per_gpu_hour", "restart_minutes", "pue", "kwh_price")  # fmt: skip
"""The CLI plan's sizing and cost inputs, which the Python plan does not take."""


def plan(
    model: str | ModelSpec,
    *,
    hardware: str | Hardware,
    gpus: int | None = None,
    max_gpus: int | None = None,
    batch: int | tuple[int, int] | range | None = None,
    batch_tokens: int | tuple[int, int] | None = None,
    frameworks: Iterable[str] | None = None,
    recompute: Iterable[str] = ("none", "selective", "selective-op", "full"),
    microbatches: Iterable[int] | None = None,
    ep_dispatchers: Iterable[str] = ("all-to-all",),
    max_tp: int | None = None,
    memory_headroom: float = DEFAULT_HEADROOM,
    objective: str = "time",
    **inputs: Any,
) -> _plan.Plan:
    """The best layouts of ``gpus`` devices (or of every count up to ``max_gpus``, as
    ``--max-gpus`` searches) that fit (``plan`` of the CLI): ``batch`` sequences per step
    (the CLI's ``--global-batch``; a range, ``(low, high)`` or ``range(low, high + 1)``,
    searches the batches in it that split evenly, as ``--global-batch LOW:HIGH``), or
    ``batch_tokens`` tokens per step (one number or ``(low, high)``: whole sequences of
    ``seq``, as ``--global-batch-tokens``);
    ``framework`` searches that one framework alone (``frameworks`` several; by default
    the planner's, fsdp2 and megatron); ``objective`` ranks (``time``, ``cost``,
    ``tokens-per-gpu``, ``mfu``); the other inputs (seq, precision, ...) as the CLI's."""
    _refuse_unsearchable(inputs)
    if batch_tokens is not None:
        batch = _token_batch(model, batch, batch_tokens, inputs)
    if batch is None:  # the CLI's --global-batch as global_batch: the name to use, not a TypeError
        keyword_values(model, inputs)
        raise SpecError("batch", "plan needs batch: sequences per step (the CLI's --global-batch)")
    if (gpus is None) == (max_gpus is None):
        raise SpecError("gpus", "plan needs gpus (one count) or max_gpus (every count up to "
                        "it), not both")  # fmt: skip
    frameworks = _frameworks(frameworks, inputs)
    hw = hardware if isinstance(hardware, Hardware) else _one_kind(hardware)
    low, high = _batch_range(batch)
    values, spec = keyword_values(model, {**inputs, "batch": high})
    setup = build(values, spec)
    options = _plan.PlanOptions(
        frameworks=_choices("frameworks", frameworks), recompute=_choices("recompute", recompute),
        micro_batches=None if microbatches is None else _counts("microbatches", microbatches),
        max_tp=max_tp, memory_headroom=memory_headroom, objective=objective,
        dispatchers=_choices("ep_dispatchers", ep_dispatchers),
    )  # fmt: skip
    if gpus is not None:
        checks.integer("gpus", gpus)
        counts: int | list[int] = gpus
    else:
        counts = device_counts(max_gpus, hw.devices_per_node)
    listed = [counts] if isinstance(counts, int) else counts
    batches = batch_choices(low, high, counts=listed) if low != high else None
    found = _plan.plan(setup.model, setup.train, hw, counts, options, batches)
    if not len(found.order):  # as the CLI: the nearest layout that fits, in the repr
        found.nearest = nearest_fitting(setup.model, setup.train, hw, counts, options, batches)
        found.nearest_searched = True
    found.caveats = plan_caveats(found, batches)
    return found


def _token_batch(model: Any, batch: Any, tokens: Any, inputs: dict) -> tuple[int, int]:
    """``batch_tokens`` as (low, high) sequences of the question's seq (its default where
    none is given), refused beside a ``batch``."""
    if batch is not None:
        raise SpecError("batch_tokens", "give batch (sequences) or batch_tokens, not both")
    low, high = _batch_range(tokens)
    seq = build(*keyword_values(model, {**inputs, "batch": 1})).train.seq
    return token_batches(low, high, seq, name="batch_tokens")


def _batch_range(batch: Any) -> tuple[int, int]:
    """``(low, high)`` of a batch (one number: both) or a range of them."""
    if isinstance(batch, str):
        raise SpecError("batch", f"batch takes a number or (low, high), not text (got {batch!r})")
    if isinstance(batch, range):
        if batch.step != 1 or not len(batch):
            raise SpecError("batch", f"batch range must be contiguous and non-empty (got {batch})")
        return batch[0], batch[-1]
    if isinstance(batch, tuple | list):
        if len(batch) != 2:
            raise SpecError("batch", f"batch takes one number or (low, high) (got {batch!r})")
        low, high = batch
        checks.integer("batch", low)
        checks.integer("batch", high)
        if low > high:
            raise SpecError("batch", f"batch range ({low}, {high}) has low > high")
        return low, high
    return batch, batch


def _refuse_unsearchable(inputs: dict[str, Any]) -> None:
    """What the planner searches, and the CLI's sizing, are not inputs of ``plan``."""
    for name in SEARCHED:
        if name in inputs:
            raise SpecError(
                name,
                f"plan searches {name}: drop it (max_tp bounds tp, "
                "microbatches lists micro-batches; estimate() prices one layout)",
            )
    for name in SIZING:
        if name in inputs:
            raise SpecError(
                name,
                f"plan() does not size a run ({name}): estimate() takes it for "
                "one layout, the CLI's plan --token-budget sizes each GPU count",
            )


def _frameworks(frameworks: Iterable[str] | None, inputs: dict[str, Any]) -> Iterable[str]:
    """``framework`` (one, as estimate names it) or ``frameworks`` (several), else the
    planner's own (fsdp2 and megatron)."""
    if "framework" in inputs:
        if frameworks is not None:
            raise SpecError("framework", "give framework (one) or frameworks (several), "
                            "not both")  # fmt: skip
        return (inputs.pop("framework"),)
    return _plan.PlanOptions().frameworks if frameworks is None else frameworks


def _one_kind(name: str) -> Hardware:
    if isinstance(name, str) and "," in name:
        raise SpecError("hardware", "plan() searches one device kind: call it once per kind "
                        "(the CLI's plan --hardware a,b compares them)")  # fmt: skip
    return get_hardware(name)


def _choices(name: str, given: Any) -> tuple[Any, ...]:
    """A search's choices: one (a string or a number) or several, never none."""
    chosen = (given,) if isinstance(given, str | int) else tuple(dict.fromkeys(given))
    if not chosen:  # each once (a probe: a framework given twice ranked each layout twice)
        raise SpecError(name, f"{name} must name at least one choice (got none)")
    return chosen


def _counts(name: str, given: Any) -> tuple[int, ...]:
    """Choices that are counts (each an integer >= 1), named as the call's argument."""
    chosen = _choices(name, given)
    for count in chosen:
        checks.integer(name, count)
    return chosen
