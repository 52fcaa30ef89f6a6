"""Why a plan's best layout, and a way out when nothing fits (issue 37, item 5).

How the next layouts differ from the best: the layout fields that change and what it costs
(tokens/s, peak memory). When no layout of the request fits, the nearest that does: first
the same devices with what the search options left out (every recompute policy and
micro-batch, FSDP2 and Megatron besides the frameworks asked for, tp up to a node,
interleaving), then 2, 4 and 8 times the devices. Units: seconds, bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from costmodel.engine.options import PlanOptions
from costmodel.engine.plan import LAYOUT, Plan, plan, score
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec

GIB = 2**30  # engine sits below costmodel.units (docs/ARCHITECTURE.md's layers)
RECOMPUTE = ("none", "selective", "selective-op", "full")
SHARDING = ("fsdp2", "megatron")
FACTORS = (1, 2, 4, 8)
"""Device multiples tried for a way out, in order (1: the same devices, wider options)."""
SLOWER = 0.10
"""How much slower than the best that fits (by the plan's objective) the nearest way out
may be: fewer changes are worth a little speed, not a step twice as long."""


WORDS = {"pp_interleave": "interleave", "sequence_parallel": "sequence parallel",
         "ep_dispatcher": "dispatcher", "ep_overlap": "all-to-all overlap",
         "grad_reduce_fp32": "fp32 gradient reduce", "micro_batch": "micro-batch",
         "grad_accum": "accumulation", "gpus": "GPUs", "zero": "ZeRO stage"}  # fmt: skip
"""What a changed layout field is called in words (the CLI's and the app's; the rest by
their own short names)."""


def change_words(changed: dict[str, Any], arrow: str = "->") -> str:
    """``dp 1->2, sequence parallel on->off`` of :func:`differences`' ``changed``."""

    def word(value: Any) -> str:
        return ("on" if value else "off") if isinstance(value, bool | np.bool_) else str(value)

    return ", ".join(
        f"{WORDS.get(k, k)} {word(a)}{arrow}{word(b)}" for k, (a, b) in changed.items()
    )


def differences(row: dict[str, Any], best: dict[str, Any]) -> dict[str, Any]:
    """What ``row`` changes from ``best``: its tokens/s relative to the best's (what the
    ranking reads: a step compares only at one batch), its peak, and each layout field
    that differs as ``[best's, row's]``."""
    changed = {k: [best[k], row[k]] for k in LAYOUT if row[k] != best[k]}
    if "etp" in changed and row["etp"] == row["tp"] and best["etp"] == best["tp"]:
        del changed["etp"]  # the experts split as the dense layers in both: tp says it
    if "zero" in changed and not any(trait(r["framework"], "zero_stages") for r in (row, best)):
        del changed["zero"]  # a framework's own sharding: fsdp (or dp) says it, no stage input
    speed = row["tokens_per_s"] / best["tokens_per_s"] - 1
    peak = row["memory_bytes_per_device.peak"] - best["memory_bytes_per_device.peak"]
    return {"tokens_per_s_change": speed, "peak_change_bytes": peak, "changed": changed}


MEASURES = {"time": ("tokens/s", "tokens_per_s", False),
            "cost": ("tokens/s per GPU", "tokens_per_s", True),
            "tokens-per-gpu": ("tokens/s per GPU", "tokens_per_s", True),
            "mfu": ("MFU", "mfu", False)}  # fmt: skip
"""What a plan's objective ranks by, as a row's change from the best reads it: (words,
quantity, per GPU)."""


def difference_text(row: dict[str, Any], best: dict[str, Any], objective: str = "time") -> str:
    """E.g. ``-0.9 % tokens/s, +1.1 GiB: dp 1->2, fsdp 4->2``, in what ``objective`` ranks
    by (``MEASURES``: under ``cost`` tokens/s per GPU, device-seconds per token's inverse)."""
    d = differences(row, best)
    fields = change_words(d["changed"]) or "same layout"
    words, key, per_gpu = MEASURES[objective]
    ratio = row[key] / best[key] * (best["gpus"] / row["gpus"] if per_gpu else 1)
    speed = round(100 * (ratio - 1), 1) + 0.0  # no "-0.0"
    peak = round(d["peak_change_bytes"] / GIB, 1) + 0.0
    return f"{speed:+.1f} % {words}, {peak:+,.1f} GiB: {fields}"


def widened(options: PlanOptions) -> PlanOptions:
    """The search options with nothing left out that could make a layout fit."""
    frameworks = tuple(dict.fromkeys((*options.frameworks, *SHARDING)))
    return replace(options, frameworks=frameworks, recompute=RECOMPUTE, micro_batches=None,
                   max_tp=None, interleave=(1, 2))  # fmt: skip


def nearest_fitting(
    model: ModelSpec,
    train: TrainSpec,
    hardware: Hardware,
    gpus: int | Sequence[int],
    options: PlanOptions,
    batches: Sequence[int] | None = None,
    near: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The layout that fits nearest the request (the search options widened on its
    devices, then :data:`FACTORS` times its largest count), with what changed in words;
    None if none up to 8x. Nearest: :func:`nearest_row` (``near``: a layout's fields to
    keep where a layout as fast keeps them). Fewer devices than a count that does not
    fit rarely fit, so a budget's smaller counts are not scaled (each would be a search of
    its own)."""
    counts = [gpus] if isinstance(gpus, int) else list(gpus)
    wide = widened(options)
    for factor in FACTORS:
        if factor == 1 and wide == options:
            continue  # the search that found nothing
        scaled = counts if factor == 1 else [max(counts) * factor]  # a budget: its top
        try:
            found = plan(model, train, hardware, scaled, wide, batches=batches)
        except SpecError:  # no valid layout of these counts
            continue
        if len(found.order):
            row = found.row(nearest_row(found, options, near))
            return {**row, "changes": what_changed(row, options, factor)}
    return None


def nearest_row(found: Plan, options: PlanOptions, near: dict[str, Any] | None) -> int:
    """Among ``found``'s fitting layouts within :data:`SLOWER` of its best by its
    objective (those whose allocator's reserve the device holds, where any does), the
    fewest choices ``options`` left out (:func:`excluded`), then the fewest of ``near``'s
    fields changed (:func:`moved`), then the best rank."""
    order = found.order
    key = score(found.columns, found.values, found.options.objective)[order]
    order = order[key <= key[0] * (1 + SLOWER)]
    safe = found.values["memory_bytes_per_device.reserved"][order] <= found.hardware.hbm_bytes
    if safe.any():  # a reserve the device holds before one it does not (TIGHT), as rank does
        order = order[safe]
    cols = {k: v[order] for k, v in found.columns.items()}
    distance = excluded(cols, options) * (len(LAYOUT) + 1) + moved(cols, near)
    return int(order[int(np.argmin(distance))])  # argmin's first: the best rank


def excluded(cols: dict[str, np.ndarray], options: PlanOptions) -> np.ndarray:
    """Per layout, how many of its choices ``options`` left out (:func:`what_changed`)."""
    n = ~np.isin(cols["recompute"], options.recompute) + 0
    n += ~np.isin(cols["framework"], options.frameworks)
    n += ~np.isin(cols["pp_interleave"], options.interleave)
    if options.micro_batches:
        n += ~np.isin(cols["micro_batch"], options.micro_batches)
    if options.max_tp is not None:
        n += cols["tp"] > options.max_tp
    return n


def moved(cols: dict[str, np.ndarray], near: dict[str, Any] | None) -> np.ndarray:
    """Per layout, how many of ``near``'s layout fields it changes (0 without ``near``)."""
    n = np.zeros(len(cols["gpus"]), dtype=np.int64)
    for key, value in (near or {}).items():
        n += cols[key] != value
    return n


def what_changed(row: dict[str, Any], options: PlanOptions, factor: int) -> list[str]:
    """The ways ``row`` leaves the request: more devices, or a choice the options excluded."""
    words = [f"{row['gpus']:,} GPUs ({factor}x)"] if factor > 1 else []
    if row["recompute"] not in options.recompute:
        words.append(f"recompute {row['recompute']}")
    if options.micro_batches and row["micro_batch"] not in options.micro_batches:
        words.append(f"micro-batch {row['micro_batch']}")
    if row["framework"] not in options.frameworks:
        words.append(f"framework {row['framework']} (sharding)")
    if options.max_tp is not None and row["tp"] > options.max_tp:
        words.append(f"tp {row['tp']}")
    if row["pp_interleave"] not in options.interleave:
        words.append(f"pp interleave {row['pp_interleave']}")
    return words
