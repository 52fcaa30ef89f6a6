"""The nearest change that makes a layout fit, found with a few bounded estimates.

Three changes that cut per-device memory on the same devices and batch, each one a flag:

1. ``recompute full`` (activations of one block per layer kept: Korthikanti et al. 2022);
2. a micro-batch of 1 sequence per device (``--microbatch 1``: more gradient-accumulation
   steps, the same global batch);
3. sharding over every data-parallel rank as the framework can (its
   ``Framework.shardings``: ZeRO-3 or FSDP over all replicas).

Each single change is tried, then each pair, then all three (at most 7 estimates); among
the fewest changes that fit, the fastest step wins, and a micro-batch change is then
raised back to the largest power of two that still fits (a few more estimates). When
none fits on these devices, :func:`more_devices` asks the smallest FSDP degree that fits
with all three (one ``sweep``, ``engine.inverse.min_fsdp_fitting``). Fits is the rule of
:mod:`costmodel.engine.fit`.
"""

from __future__ import annotations

import itertools
from typing import Any

from costmodel.engine.estimate import Estimate, estimate
from costmodel.engine.fit import budget_bytes, fits
from costmodel.engine.inverse import min_fsdp_fitting
from costmodel.frameworks.registry import framework_of
from costmodel.specs.checks import SpecError
from costmodel.specs.model import TrainSpec
from costmodel.specs.parallel import ParallelSpec

Change = tuple[str, dict[str, Any], dict[str, Any], str]
"""(words, TrainSpec changes, ParallelSpec changes, CLI flags)."""


def micro_per_device(train: TrainSpec, par: ParallelSpec) -> int:
    """Sequences per device per micro-batch: batch / (dp · fsdp · grad_accum)."""
    return train.batch // par.batch_step(train.grad_accum)


def _micro(train: TrainSpec, par: ParallelSpec, micro: int) -> Change:
    accum = train.batch // par.batch_step(micro)
    return (f"micro-batch {micro} per device (grad-accum {accum})", {"grad_accum": accum}, {},
            f"--microbatch {micro}")  # fmt: skip


def changes(train: TrainSpec, par: ParallelSpec) -> list[Change]:
    """The changes this layout can still take (one already in effect is left out)."""
    out: list[Change] = []
    if train.recompute != "full":
        out.append(("recompute full", {"recompute": "full"}, {}, "--recompute full"))
    if micro_per_device(train, par) > 1:
        out.append(_micro(train, par, 1))
    replicas, fw = par.dp * par.fsdp, framework_of(par)
    dp, fsdp, zero = max(fw.shardings(replicas), key=lambda s: (s[1], s[2]))
    if (dp, fsdp) != (par.dp, par.fsdp) or (fsdp > 1 and zero > par.zero):
        stage = f", ZeRO-{zero}" if fw.zero_stages else ""
        out.append((f"shard over all {replicas} data-parallel ranks (fsdp {fsdp}{stage})",
                    {}, {"dp": dp, "fsdp": fsdp, "zero": zero},
                    f"--dp {dp} --fsdp {fsdp} --zero {zero}"))  # fmt: skip
    return out


def _apply(est: Estimate, chosen: tuple[Change, ...]) -> Estimate | None:
    """The estimate with ``chosen`` applied (None where a rule refuses the result)."""
    t_changes = {k: v for c in chosen for k, v in c[1].items()}
    p_changes = {k: v for c in chosen for k, v in c[2].items()}
    assert est.parallel is not None
    try:
        return estimate(est.model, est.train.replace(**t_changes),
                        est.parallel.replace(**p_changes), est.hardware)  # fmt: skip
    except SpecError:
        return None


def nearest_fit(
    est: Estimate, headroom: float | None = None, budget: float | None = None
) -> dict[str, Any] | None:
    """The fewest of :func:`changes` that make ``est`` fit (the fastest of those), as
    ``{change, flags, inputs, peak_bytes, reserved_bytes, step_s, mfu}`` (``inputs``: the
    changed fields of TrainSpec and ParallelSpec); None when even all of
    them together do not fit."""
    assert est.parallel is not None and est.hardware is not None
    allowed = budget_bytes(est.hardware, headroom, budget)
    options = changes(est.train, est.parallel)
    for n in range(1, len(options) + 1):
        found = []
        for chosen in itertools.combinations(options, n):
            got = _apply(est, chosen)
            if got is not None and fits(got.values, allowed):
                found.append((got["time_s.step"], chosen, got))
        if found:
            _, chosen, got = min(found, key=lambda f: f[0])
            chosen, got = _largest_micro(est, chosen, got, allowed)
            return _answer(chosen, got)
    return None


def _largest_micro(est: Estimate, chosen: tuple[Change, ...], got: Estimate, allowed: float):
    """With a micro-batch of 1 among ``chosen``, the largest power of two that still fits."""
    assert est.parallel is not None
    if not any(c[3].startswith("--microbatch") for c in chosen):
        return chosen, got
    rest = tuple(c for c in chosen if not c[3].startswith("--microbatch"))
    micro, top = 2, micro_per_device(est.train, est.parallel)
    while micro < top and top % micro == 0:
        bigger = (*rest, _micro(est.train, est.parallel, micro))
        trial = _apply(est, bigger)
        if trial is None or not fits(trial.values, allowed):
            break
        chosen, got, micro = bigger, trial, micro * 2
    return chosen, got


def _answer(chosen: tuple[Change, ...], got: Estimate) -> dict[str, Any]:
    v = got.values
    return {
        "change": " + ".join(c[0] for c in chosen),
        "flags": " ".join(c[3] for c in chosen),
        "inputs": {k: x for c in chosen for k, x in (*c[1].items(), *c[2].items())},
        "peak_bytes": v["memory_bytes_per_device.peak"],
        "reserved_bytes": v["memory_bytes_per_device.reserved"],
        "step_s": v["time_s.step"],
        "mfu": v["mfu"],
    }


MAX_FSDP = 1024
"""Largest FSDP degree :func:`more_devices` tries (one sweep of this many rows)."""


def more_devices(
    est: Estimate, headroom: float | None = None, budget: float | None = None
) -> dict[str, Any] | None:
    """The devices a layout needs when no change of :func:`changes` fits on its own: the
    smallest FSDP degree (up to :data:`MAX_FSDP`) that fits with recompute full and one
    sequence per device per micro-batch, the other degrees kept (so the global batch
    grows with it); None when none does."""
    p = est.parallel
    assert p is not None and est.hardware is not None
    train = est.train.replace(recompute="full", grad_accum=est.train.batch // (p.dp * p.fsdp))
    try:
        found = min_fsdp_fitting(est.model, train, p, est.hardware, budget, MAX_FSDP, headroom)
    except SpecError:
        return None
    if found["fsdp"] is None:
        return None
    devices = p.replace(fsdp=found["fsdp"]).devices
    batch = p.dp * found["fsdp"] * train.grad_accum
    return {"fsdp": found["fsdp"], "devices": devices, "batch": batch,
            "peak_bytes": found["per_device_bytes"], "reserved_bytes": found["reserved_bytes"],
            "flags": f"--gpus {devices} --dp {p.dp} --fsdp {found['fsdp']} --batch {batch} "
                     "--recompute full --microbatch 1"}  # fmt: skip
