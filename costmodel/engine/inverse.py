"""Inverse questions over the same expressions.

- ``max_batch`` / ``max_seq``: the largest batch or sequence whose per-device peak fits, by
  bisection over ``estimate`` (peak memory is monotone in both).
- critical batch for compute-bound training: ``costmodel.bounds``.
"""

from __future__ import annotations

from collections.abc import Callable

from costmodel.engine.estimate import estimate
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec


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
    budget_bytes: float | None = None,
) -> dict:
    """Largest ``batch`` or ``seq`` whose per-device peak fits (default: HBM capacity)."""
    if field not in ("batch", "seq"):
        raise ValueError(f"field must be batch or seq (got {field!r})")
    budget = hardware.hbm_bytes if budget_bytes is None else budget_bytes
    if field == "batch":
        step = parallel.batch_step(train.grad_accum)
    else:
        step = parallel.cp * (parallel.tp if parallel.sequence_parallel else 1)

    def fits(value: int) -> bool:
        est = estimate(model, train.replace(**{field: value}), parallel, hardware)
        return est["memory_bytes_per_device.peak"] <= budget

    limit = model.max_positions if (field == "seq" and model.pos == "learned") else 2**24
    best = largest_fitting(fits, step, max(step, limit - limit % step), step)
    return {field: best, "budget_bytes": budget}
