"""The nearest change that makes a layout fit, keeping the user's batch.

First three changes that cut per-device memory on the same devices and batch:

1. ``recompute full`` (activations of one block per layer kept: Korthikanti et al. 2022),
   then in its place the lighter policy that still fits and is faster (selective,
   selective-op);
2. a micro-batch of 1 sequence per device (``--microbatch 1``: more gradient-accumulation
   steps, the same global batch);
3. sharding over every data-parallel rank as the framework can (its
   ``Traits.most_sharded``: ZeRO-3, FSDP2 or Megatron-FSDP over all replicas), or a
   deeper ZeRO stage over the same ranks.

Each single change is tried, then each pair, then all three (at most 7 estimates); among
the fewest changes that fit, the fastest step whose allocator's reserve the device holds
wins (else the fastest: ``fits, but TIGHT``), and a micro-batch change is then raised back
to the largest power of two that still fits without turning TIGHT (a few more estimates). When
none fits, the planner's own search answers (:func:`costmodel.engine.why.nearest_fitting`:
every layout of these devices at the same global batch, then 2, 4 and 8 times the
devices), so ``estimate`` and ``plan`` name the same way out. An answer's ``inputs`` are
the input names of :mod:`costmodel.inputs` (``microbatch``, ``gpus``, the specs' fields),
which the app sets as widgets and ``flags`` spells as CLI flags. Fits is the rule of
:mod:`costmodel.engine.fit`.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from costmodel.engine.estimate import Estimate, estimate
from costmodel.engine.fit import budget_bytes, fits
from costmodel.engine.options import PlanOptions
from costmodel.engine.plan import layout_label
from costmodel.engine.why import nearest_fitting
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait, traits_of
from costmodel.specs.model import TrainSpec
from costmodel.specs.parallel import ParallelSpec

Change = tuple[str, dict[str, Any]]
"""(words, the inputs it sets: recompute, microbatch, dp/fsdp/zero)."""

PLANNED = ("framework", "zero", "dp", "fsdp", "tp", "sequence_parallel", "pp", "pp_interleave",
           "cp", "ep", "etp", "ep_dispatcher", "ep_overlap", "grad_reduce_fp32",
           "recompute")  # fmt: skip
"""A plan row's layout fields that are inputs of the same name."""
NEAR = tuple(k for k in PLANNED if k != "dp")
"""What counts as a change of layout when the planner names the nearest that fits (dp
follows from the devices and the rest)."""


def stated_layout(row: dict[str, Any], fields: tuple[str, ...] = PLANNED) -> tuple[str, ...]:
    """The ``fields`` of a plan row its ``estimate`` states: all but the ZeRO stage of a
    framework that shards its own way (``--zero`` is refused there; the row's stage is what
    that framework runs)."""
    own = not trait(row["framework"], "zero_stages")
    return tuple(k for k in fields if not (k == "zero" and own))


def micro_per_device(train: TrainSpec, par: ParallelSpec) -> int:
    """Sequences per device per micro-batch: batch / (dp · fsdp · grad_accum)."""
    return train.batch // par.batch_step(train.grad_accum)


def flags(inputs: dict[str, Any]) -> str:
    """The CLI flags that set ``inputs`` (``--no-KEY`` for a false switch)."""
    out = []
    for key, value in inputs.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(name if value else "--no-" + name[2:])
        else:
            out.append(f"{name} {value}")
    return " ".join(out)


def changes(train: TrainSpec, par: ParallelSpec) -> list[Change]:
    """The changes this layout can still take (one already in effect is left out)."""
    out: list[Change] = []
    if train.recompute != "full":
        out.append(("recompute full", {"recompute": "full"}))
    if micro_per_device(train, par) > 1:
        out.append(_micro(train, par, 1))
    replicas, fw = par.dp * par.fsdp, traits_of(par)
    dp, fsdp, zero = fw.most_sharded(replicas)
    if (dp, fsdp) != (par.dp, par.fsdp):
        stage = {"zero": zero} if fw.zero_stages else {}  # else the framework's own
        named = f", ZeRO-{zero}" if stage else f", {fw.fsdp_name}"
        out.append((f"shard over all {replicas} data-parallel ranks (fsdp {fsdp}{named})",
                    {"dp": dp, "fsdp": fsdp, **stage}))  # fmt: skip
    elif fsdp > 1 and zero > par.zero and fw.zero_stages:  # the same ranks, a deeper stage
        out.append((f"ZeRO-{zero} over the {fsdp} fsdp ranks (stage {par.zero} -> {zero})",
                    {"zero": zero}))  # fmt: skip
    return out


def _micro(train: TrainSpec, par: ParallelSpec, micro: int) -> Change:
    accum = train.batch // par.batch_step(micro)
    return f"micro-batch {micro} per device (grad-accum {accum})", {"microbatch": micro}


def _apply(est: Estimate, chosen: tuple[Change, ...]) -> Estimate | None:
    """The estimate with ``chosen`` applied (None where a rule refuses the result)."""
    inputs = {k: v for _, given in chosen for k, v in given.items()}
    assert est.parallel is not None
    par = est.parallel.replace(**{k: inputs[k] for k in ("dp", "fsdp", "zero") if k in inputs})
    train = est.train.replace(**{k: inputs[k] for k in ("recompute",) if k in inputs})
    if "microbatch" in inputs:
        train = train.replace(grad_accum=train.batch // par.batch_step(inputs["microbatch"]))
    try:
        return estimate(est.model, train, par, est.hardware)
    except SpecError:
        return None


def nearest_fit(
    est: Estimate,
    headroom: float | None = None,
    budget: float | None = None,
    planner: bool = True,
) -> dict[str, Any] | None:
    """The nearest way to fit ``est`` at its global batch, as ``{change, inputs, flags,
    peak_bytes, reserved_bytes, step_s, mfu, tight}``: the fewest of :func:`changes` that fit
    (the fastest of those), else (``planner``) the planner's best layout
    (:func:`planned`); None when nothing fits up to 8 times the devices (or, without the
    planner, with these changes)."""
    assert est.parallel is not None and est.hardware is not None
    allowed = budget_bytes(est.hardware, headroom, budget)
    options = changes(est.train, est.parallel)
    for n in range(1, len(options) + 1):
        found = []
        for chosen in itertools.combinations(options, n):
            got = _apply(est, chosen)
            if got is not None and fits(got.values, allowed):
                found.append((_tight(got), got["time_s.step"], chosen, got))
        if found:  # a reserve the device holds before a faster one it does not (TIGHT)
            _, _, chosen, got = min(found, key=lambda f: f[:2])
            chosen, got = _largest_micro(est, chosen, got, allowed)
            chosen, got = _lightest_recompute(est, chosen, got, allowed)
            inputs = {k: v for _, given in chosen for k, v in given.items()}
            return _answer(" + ".join(c[0] for c in chosen), inputs, got)
    return planned(est, allowed) if planner else None


def _largest_micro(est: Estimate, chosen: tuple[Change, ...], got: Estimate, allowed: float):
    """With a micro-batch of 1 among ``chosen``, the largest power of two that still fits."""
    assert est.parallel is not None
    if not any("microbatch" in c[1] for c in chosen):
        return chosen, got
    rest = tuple(c for c in chosen if "microbatch" not in c[1])
    micro, top = 2, micro_per_device(est.train, est.parallel)
    while micro < top and top % micro == 0:
        bigger = (*rest, _micro(est.train, est.parallel, micro))
        trial = _apply(est, bigger)
        if trial is None or not fits(trial.values, allowed) or _tight(trial) > _tight(got):
            break
        chosen, got, micro = bigger, trial, micro * 2
    return chosen, got


def _lightest_recompute(
    est: Estimate, chosen: tuple[Change, ...], got: Estimate, allowed: float
) -> tuple[tuple[Change, ...], Estimate]:
    """With ``recompute full`` among ``chosen``, the fastest lighter policy (selective,
    selective-op: recomputing less) that fits with the rest of the change, no TIGHTer (a
    probe: full at 4.46 s was offered where selective-op fit at 3.85 s)."""
    if not any(c[1].get("recompute") == "full" for c in chosen):
        return chosen, got
    rest = tuple(c for c in chosen if "recompute" not in c[1])
    for policy in LIGHTER:
        if policy == est.train.recompute:
            continue
        lighter = (*rest, (f"recompute {policy}", {"recompute": policy}))
        trial = _apply(est, lighter)
        if (trial is not None and fits(trial.values, allowed) and _tight(trial) <= _tight(got)
                and trial["time_s.step"] < got["time_s.step"]):  # fmt: skip
            chosen, got = lighter, trial
    return chosen, got


LIGHTER = ("selective", "selective-op")
"""Recompute policies lighter than full that a nearest fit tries in its place."""


def _tight(got: Estimate) -> bool:
    """The allocator's reserve over the device's memory (the verdict's ``fits, but TIGHT``)."""
    assert got.hardware is not None
    return float(got["memory_bytes_per_device.reserved"]) > got.hardware.hbm_bytes


def _answer(change: str, inputs: dict[str, Any], got: Estimate) -> dict[str, Any]:
    """The way out as the verdict says it; ``tight``: its reserve is over the device's
    memory (the best there is: every change that fits is TIGHT)."""
    v = got.values
    return {"change": change, "inputs": inputs, "flags": flags(inputs),
            "peak_bytes": float(v["memory_bytes_per_device.peak"]),
            "reserved_bytes": float(v["memory_bytes_per_device.reserved"]),
            "step_s": float(v["time_s.step"]), "mfu": float(v["mfu"]),
            "tight": _tight(got)}  # fmt: skip


def planned(est: Estimate, allowed: float) -> dict[str, Any] | None:
    """The planner's layout nearest ``est``'s that fits within ``allowed`` bytes at its
    global batch (the fewest :data:`NEAR` fields changed among those nearly as fast as the
    best: :func:`costmodel.engine.why.nearest_row`): on its devices
    with every layout, recompute policy and micro-batch, then on 2, 4 and 8 times them
    (:func:`costmodel.engine.why.nearest_fitting`), its framework first (where the planner
    searches it), priced with the user's other inputs; None when none fits (so priced) or
    the planner cannot state the question (a spec it refuses)."""
    p, hw = est.parallel, est.hardware
    assert p is not None and hw is not None
    try:
        share = min(1.0, allowed / hw.hbm_bytes)
        options = PlanOptions(memory_headroom=share)  # the planner's frameworks, or the user's
        if trait(p.framework, "planned"):
            options = replace(options, frameworks=(p.framework,))
        near = {k: _current(est, k) for k in stated_layout({"framework": p.framework}, NEAR)}
        row = nearest_fitting(est.model, est.train, hw, p.devices, options, [est.train.batch],
                              near)  # fmt: skip
    except SpecError:
        return None
    if row is None:
        return None
    got = _as_stated(est, row)  # the user's other inputs kept: imbalance, overlap, ...
    if got is None or not fits(got.values, allowed):
        return None
    inputs = {k: row[k] for k in stated_layout(row) if row[k] != _current(est, k)}
    if row["etp"] == row["tp"]:
        inputs.pop("etp", None)  # the experts split as the dense layers: the default
    inputs["microbatch"] = row["micro_batch"]
    if row["gpus"] != p.devices:
        inputs = {"gpus": row["gpus"], **inputs}
    more = f" on {row['gpus']:,} devices" if row["gpus"] != p.devices else ""
    return _answer(f"the planner's layout nearest yours{more} at batch {est.train.batch:,}: "
                   f"{layout_label(row)}", inputs, got)  # fmt: skip


def _as_stated(est: Estimate, row: dict[str, Any]) -> Estimate | None:
    """The planner's ``row`` as the user's question states it: its layout, recompute and
    micro-batch over every other input of ``est`` (the planner prices its own defaults for
    what it does not search: ep_imbalance, overlap, bucket sizes). None where a rule
    refuses it."""
    assert est.parallel is not None
    layout = {k: row[k] for k in stated_layout(row) if k != "recompute"}
    try:
        par = est.parallel.replace(**layout)
        train = est.train.replace(recompute=row["recompute"])
        train = train.replace(grad_accum=train.batch // par.batch_step(row["micro_batch"]))
        return estimate(est.model, train, par, est.hardware)
    except SpecError:
        return None


def _current(est: Estimate, key: str) -> Any:
    """The estimate's value of a planned layout field."""
    assert est.parallel is not None
    return getattr(est.train if key == "recompute" else est.parallel, key)
