"""Inverse questions answered by the full model (the engine's per-device peak).

- ``max_fitting``: the largest batch or sequence that fits, by bisection over ``estimate``
  (peak memory is monotone in both).
- ``min_fsdp_fitting``: the smallest FSDP degree that fits, keeping each device's
  micro-batch, by one ``sweep`` over every degree.

"Fits" is the one rule of :mod:`costmodel.engine.fit` (the peak within
headroom x device memory, or within an explicit budget in bytes).

The Scaling Book's closed forms for the same questions are in :mod:`costmodel.book`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from types import SimpleNamespace

import numpy as np

from costmodel.engine.estimate import estimate
from costmodel.engine.fit import PEAK, RESERVED, budget_bytes, fits
from costmodel.engine.sweep import sweep
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import fixed_stage, trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec, batch_step, moe_rule
from costmodel.specs.rules import MAX_BATCH

SEARCH_LIMIT = 2**24
"""Largest batch or sequence length ``max_fitting`` tries (sequences or tokens)."""


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int, step: int = 1) -> int | None:
    """Largest multiple of ``step`` in [lo, hi] with ``fits`` true (fits is monotone)."""
    if not fits(lo):
        return None
    lo_k, hi_k = lo // step, hi // step
    while lo_k < hi_k:
        mid = (lo_k + hi_k + 1) // 2
        if fits(mid * step):
            lo_k = mid
        else:
            hi_k = mid - 1
    return lo_k * step


def max_fitting(
    model: ModelSpec,
    train: TrainSpec,
    parallel: ParallelSpec,
    hardware: Hardware,
    field: str,
    budget: float | None = None,
    headroom: float | None = None,
) -> dict:
    """Largest ``batch`` or ``seq`` that fits ``budget`` bytes per device (default: the
    fit rule's headroom x device memory, :func:`costmodel.engine.fit.budget_bytes`); where
    the answer's allocator reserve is over the device's memory (``fits, but TIGHT``),
    ``<field>_untight`` is the largest whose reserve the device holds (None: none).

    The search stops at :data:`SEARCH_LIMIT` (or the model's learned positions); when the
    answer is that bound, ``limited_by`` says so: the budget did not set it. Where even the
    smallest value the layout allows does not fit, the answer is None and ``reason`` says
    why (its peak against the budget)."""
    checks.choice("field", field, ("batch", "seq"))
    allowed = budget_bytes(hardware, headroom, budget)
    step = parallel.batch_step(train.grad_accum) if field == "batch" else parallel.seq_step()

    def fitting(value: int) -> bool:
        est = estimate(model, train.replace(**{field: value}), parallel, hardware)
        return fits(est.values, allowed)

    def held(value: int) -> bool:  # fits, and the device holds the allocator's reserve
        est = estimate(model, train.replace(**{field: value}), parallel, hardware)
        reserved = est.values["memory_bytes_per_device.reserved"]
        return fits(est.values, allowed) and reserved <= hardware.hbm_bytes

    learned = field == "seq" and model.pos == "learned"
    limit = model.max_positions if learned else SEARCH_LIMIT
    top = max(step, limit - limit % step)
    best = largest_fitting(fitting, step, top, step)
    out: dict = {field: best, "budget_bytes": allowed}
    if best is not None and not held(best):  # TIGHT at the answer: the largest that is not
        out[f"{field}_untight"] = largest_fitting(held, step, best, step)
    if best is None:  # the smallest value the layout allows does not fit: say so
        smallest = estimate(model, train.replace(**{field: step}), parallel, hardware)
        said = smallest.fit(headroom, budget).sentence()
        out["reason"] = (f"even {field} {step:,} {said}; estimate at {field} {step:,} names "
                         "the nearest change that fits")  # fmt: skip
    if field == "seq" and not learned and best is not None and best > model.max_positions:
        out["note"] = (f"{best:,} tokens is past {model.name}'s {model.max_positions:,} "
                       "trained positions: memory allows it, the model needs position scaling "
                       "(e.g. YaRN) or long-context training for it")  # fmt: skip
    m = train.grad_accum
    if field == "seq" and best is not None and m < parallel.pp:  # 1F1B holds min(m, pp)
        pipe = (f"at grad-accum {m} a pipeline of {parallel.pp} stages holds {m} "
                f"micro-batch{'es' * (m > 1)} in flight; a larger batch (more micro-batches) "
                "holds more and lowers this answer")  # fmt: skip
        out["note"] = f"{out['note']}; {pipe}" if "note" in out else pipe
    out["assumed"] = held_fixed(train, parallel, field)
    if best == top:
        bound = (
            f"the model's {limit:,} learned positions" if learned else f"the search limit, {top:,}"
        )
        out["limited_by"] = f"{field} reached {bound}, not the budget: more may fit"
        out["bound"] = bound
    return out


def held_fixed(train: TrainSpec, parallel: ParallelSpec, field: str) -> str:
    """What a max-batch / max-seq / min-fsdp (``field`` fsdp) answer holds fixed, in words."""
    t, p = train, parallel
    micro = t.batch // p.batch_step(t.grad_accum)
    if field == "batch":  # the micro-batch is what grows
        held = f"seq {t.seq}, grad-accum {t.grad_accum} (the micro-batch per device grows)"
    elif field == "fsdp":  # each device keeps its micro-batch: the batch grows with the degree
        held = (f"micro-batch {micro} x seq {t.seq} per device x grad-accum {t.grad_accum} "
                "(the batch grows with the degree)")  # fmt: skip
    else:
        held = f"batch {t.batch}, micro-batch {micro} per device x grad-accum {t.grad_accum}"
    shards = "" if field == "fsdp" else f"fsdp {p.fsdp}, "
    return (f"{held}, framework "
            f"{p.framework}, dp {p.dp}, {shards}tp {p.tp}, pp {p.pp}, cp {p.cp}, "
            f"recompute {t.recompute}, {t.precision}")  # fmt: skip


def min_fsdp_fitting(
    model: ModelSpec,
    train: TrainSpec,
    parallel: ParallelSpec,
    hardware: Hardware,
    budget: float | None = None,
    max_fsdp: int = 2**16,
    headroom: float | None = None,
) -> dict:
    """Smallest FSDP degree (1..max_fsdp) that fits ``budget`` bytes per device (default:
    the fit rule's headroom x device memory), and ``fsdp_usable``, the power of two at or
    above it (a degree node sizes divide; 7 fits where 8 GPUs run 8); where the answer is
    ``fits, but TIGHT``, ``fsdp_untight`` is the smallest whose allocator reserve the
    device holds (None: none, or not TIGHT). Each device keeps
    its micro-batch of sequences, so the global batch grows with the degree:
    batch = dp · fsdp · micro-batch · grad_accum."""
    allowed = budget_bytes(hardware, headroom, budget)
    micro = train.batch // parallel.batch_step(train.grad_accum)
    fsdp = _allowed_fsdp(model, parallel, np.arange(1, max_fsdp + 1))
    per_degree = batch_step(parallel.dp, 1, train.grad_accum) * micro
    fsdp = fsdp[fsdp * per_degree <= MAX_BATCH]  # the degrees a step's batch allows
    if not fsdp.size:
        raise SpecError("batch", f"even fsdp 1 makes a step of {per_degree:,} sequences, over "
                        f"{MAX_BATCH:,}")  # fmt: skip
    fixed = {**_fields(train), **_fields(parallel)}
    fixed.update(fsdp=fsdp, batch=batch_step(parallel.dp, fsdp, train.grad_accum) * micro)
    if parallel.zero == fixed_stage(parallel.framework, parallel.fsdp):
        # the framework's own stage at each degree (Megatron-FSDP over fsdp > 1)
        fixed["zero"] = fixed_stage(parallel.framework, fsdp)
    values = sweep(model, hardware=hardware, quantities=[PEAK, RESERVED], **fixed)
    ok = np.asarray(fits(values, allowed))
    fitting = np.flatnonzero(ok)
    at = int(fitting[0]) if fitting.size else int(np.argmin(values[PEAK]))
    found = int(fsdp[at]) if fitting.size else None
    untight = np.flatnonzero(ok & (np.asarray(values[RESERVED]) <= hardware.hbm_bytes))
    out = {
        "fsdp": found,
        "fsdp_usable": None if found is None else 1 << (found - 1).bit_length(),
        "per_device_bytes": float(values[PEAK][at]),
        "reserved_bytes": float(values[RESERVED][at]),
        "budget_bytes": allowed,
        "micro_batch_per_device": micro,
        "fsdp_untight": None,
    }
    if found is not None and values[RESERVED][at] > hardware.hbm_bytes:  # TIGHT: the next
        out["fsdp_untight"] = int(fsdp[untight[0]]) if untight.size else None
    if not fitting.size:
        out["why"] = (
            f"no fsdp degree up to {int(fsdp[-1]):,} fits: the lowest peak, "
            f"{out['per_device_bytes'] / 2**30:,.2f} GiB at fsdp {int(fsdp[at]):,}, is above "
            f"the {allowed / 2**30:,.2f} GiB budget; what fsdp does not shrink (the activations of "
            f"{micro} x {train.seq:,} tokens, the gathered layers) is too large: a shorter "
            "seq, recompute full, or cp / tp / pp"
        )
    return out


def _allowed_fsdp(model: ModelSpec, parallel: ParallelSpec, fsdp: np.ndarray) -> np.ndarray:
    """The degrees the layout's expert parallelism allows with its other degrees (ep
    divides the data-parallel ranks and nests with the shard group; every degree without)."""
    with checks.collect_masks() as masks:
        moe_rule(
            SimpleNamespace(**{**_fields(parallel), "fsdp": fsdp}),
            model,
            trait(parallel.framework, "shards_over_cp"),
        )
    return fsdp[checks.passing(masks, len(fsdp))]


def _fields(spec: object) -> dict:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}  # type: ignore[arg-type]
