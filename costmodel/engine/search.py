"""Which candidate layouts a plan evaluates, part by part (a part: one global batch on one
device count).

:func:`collect` evaluates every valid layout of every part: what the app draws (memory
against step time of every layout, the fitting region shaded) and what a sizing reads (the
best layout of each device count).

:func:`collect_top` answers "the ``top`` best layouts by tokens/s" for far less, with the
same rows in the same order among them:

- **memory first**: every valid layout's per-device memory, then its time only where it
  fits (most layouts of a large model do not: 888,003 of 9.0 M for Turing-NLG 530B);
- **branch and bound over device counts**, largest first. No layout of ``n`` devices runs
  more than ``n * ceiling / flops_per_token`` tokens/s: ``ceiling`` is the fastest FLOP/s
  any kernel of the step runs (:func:`flops_ceiling`), ``flops_per_token`` the model FLOPs
  of a token (MFU's numerator, ``costmodel.single.flops.flop_conventions["useful"]``,
  which every layout executes at least: causal flash runs whole tiles, recomputation
  re-runs, communication, bubbles and host time only add). A count whose bound is below
  the ``top``-th best found, less the planner's tie margin (``TIE``), can place no layout
  among the ``top`` (its layouts rank in a later tier) and is not enumerated.
- **the same bound per candidate**, once ``top`` layouts fit: a recompute policy re-runs
  a share of the matmuls on top (:func:`recomputed_share`; full recomputation of
  Turing-NLG 530B, 22 %), and a pipeline idles ``(pp - 1) / v`` micro-batches beside its
  ``m`` (``pp - m + (m - 1) / v`` where m < pp: ``costmodel.parallel.pipeline``'s bubble),
  so a candidate's bound is divided by ``(1 + share) x (1 + bubble / m)``; a candidate
  whose bound cannot place is not evaluated, and a policy no candidate of a count can
  place with is not enumerated (Turing-NLG: 470,580 of 1.5 M valid candidates evaluated).
``tests/test_plan_search.py`` checks the bounds on every valid layout of dense, MoE, fp8,
long-context and TPU searches, and that the pruned search's top rows equal the full
search's. A schedule that hides the bubble would have to change the bound with it.
Units: seconds, bytes, FLOP/s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any

import numpy as np

from costmodel.engine.estimate import symbol_values
from costmodel.engine.fit import PEAK, fits
from costmodel.engine.grid import SEARCHED, layout_grid
from costmodel.engine.options import PlanOptions
from costmodel.engine.quantities import MEMORY as MEMORY  # re-exported
from costmodel.engine.quantities import (
    PARALLEL_STRUCTURE,
    TIMES,
    TRAIN_STRUCTURE,
)
from costmodel.engine.sweep import factorize, sweep
from costmodel.engine.threads import cores, in_threads
from costmodel.single.flops import CORE_OPS, flop_conventions, recompute_flops_by_op
from costmodel.single.precision import PRECISIONS
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.core import numeric

QUANTITIES = TIMES[:10] + MEMORY + TIMES[10:]
"""What the planner evaluates per layout; a top search keeps the peak memory of every
layout and the whole only where a layout fits."""

TIE = 0.005
"""Step times within this fraction of each other rank as equals (far below the model's
resolution: its median error on published runs is ~6 %)."""


@dataclass
class Found:
    """The evaluated layouts (columns and quantities; a top search keeps those that fit
    and each count's smallest peak, NaN times where it does not fit), how many were
    enumerated and valid, and the device counts a top search skipped."""

    cols: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    enumerated: int
    valid: int
    structures: int = 0
    """Distinct structures evaluated (each one call of the formulas on its columns)."""
    skipped: tuple[int, ...] = field(default=())


def flops_ceiling(train: TrainSpec, hardware: Hardware) -> float:
    """The fastest FLOP/s any kernel of a training step runs on ``hardware``: its GEMMs
    (peak x efficiency.matmul in the precision's dtype) or its fused attention (each
    kernel's forward and backward rate at long sequences, the most it reaches)."""
    prec = PRECISIONS[train.precision]
    rates = [hardware.matmul_flops(prec.peak_dtype)]
    kernels = list(hardware.attention_kernels) or ["auto"]
    for kernel in kernels:
        for phase in ("forward", "backward"):
            rates.append(float(hardware.attention_peak(prec.attention_peak_dtype, kernel, phase)))
    return max(rates)


@lru_cache(maxsize=64)
def recomputed_share(model: ModelSpec, train: TrainSpec, policy: str) -> float:
    """The matmul FLOPs recompute ``policy`` re-runs in backward over the useful FLOPs
    (MFU's numerator; ``costmodel.single.flops.recompute_flops_by_op``): a layout with that
    policy executes at least ``1 +`` this many useful FLOPs, each at most at the ceiling.
    The attention core is left out (its recomputed FLOPs are counted over every pair, the
    fused kernel's time over the causal ones), which only makes the bound looser."""
    train = train.replace(recompute=policy)
    with numeric(symbol_values(model, train)):
        redo = sum(v for k, v in recompute_flops_by_op(model, train).items() if k not in CORE_OPS)
        return float(redo / flop_conventions(model, train)["useful"])


def collect(
    model: ModelSpec, train: TrainSpec, hardware: Hardware, counts: Sequence[int],
    options: PlanOptions, batches: Sequence[int] | None,
) -> Found:  # fmt: skip
    """Every valid layout of every part, every quantity of each."""
    parts, enumerated = _valid_parts(model, train, hardware, counts, options, batches)
    if not parts:
        return Found({}, {}, enumerated, 0)
    cols = _joined(list(parts.values()))
    structures = _structures(model, train, cols)
    values = evaluate(model, train, hardware, cols)
    return Found(cols, values, enumerated, len(cols["tp"]), len(structures))


def collect_top(
    model: ModelSpec, train: TrainSpec, hardware: Hardware, counts: Sequence[int],
    options: PlanOptions, batches: Sequence[int] | None, budget: float, top: int,
) -> Found:  # fmt: skip
    """The parts that can hold one of the ``top`` best layouts (by tokens/s; module
    docstring), largest device count first; times only where a layout fits ``budget``.
    Counts go alone until ``top`` layouts fit, then ``CHUNK`` at a time (enumerated on
    every core, evaluated together up to ``WAVE_ROWS`` candidates: one sweep's structure
    groups for many counts); which counts are searched does not depend on the cores."""
    prune = options.objective == "time"
    ceiling = flops_ceiling(train, hardware)
    bound = _Bound(top, PRECISIONS[train.precision], hardware)
    found: dict[tuple[int, int], tuple[dict, dict]] = {}  # (batch, count): cols, values
    enumerated, valid, skipped, structures = 0, 0, [], set()
    remaining = sorted({int(c) for c in counts}, reverse=True)
    shares = {p: recomputed_share(model, train, p) for p in options.recompute}

    def evaluated(wave: dict) -> int:
        return _evaluate_wave(model, train, hardware, wave, budget, found, bound, structures)

    def enumerated_parts(item: tuple[int, tuple[str, ...], _Cut]) -> tuple[dict, int]:
        count, policies, cut = item
        allowed = replace(options, recompute=policies)
        wanted = cut.placeable(ceiling, shares) if cut.floor else None
        return _valid_parts(model, train, hardware, [count], allowed, batches, wanted)

    while remaining:
        chunk = []
        cut = bound.cut() if prune else _Cut()  # read once a chunk: the same on any cores
        while remaining and len(chunk) < (CHUNK if bound.known else 1):
            count = remaining.pop(0)
            policies = tuple(p for p in options.recompute
                             if cut.may_place(count * ceiling / (1 + shares[p])))  # fmt: skip
            (chunk.append((count, policies, cut)) if policies else skipped.append(count))
        wave: dict[tuple[int, int], dict] = {}
        for parts, n in in_threads(enumerated_parts, chunk, min(cores(), len(chunk))):
            enumerated += n
            wave.update(parts)
            if sum(len(p["tp"]) for p in wave.values()) >= WAVE_ROWS:
                valid, wave = valid + evaluated(wave), {}
        if wave:
            valid += evaluated(wave)
    if not found:
        return Found({}, {}, enumerated, 0, skipped=tuple(sorted(skipped)))
    order = [(int(b), int(c)) for b in batches or [train.batch] for c in counts]
    kept = [found[key] for key in dict.fromkeys(order) if key in found]
    cols, values = _joined([c for c, _ in kept]), _joined([v for _, v in kept])
    return Found(cols, values, enumerated, valid, len(structures), tuple(sorted(skipped)))


WAVE_ROWS = 2_000_000
"""Valid candidates evaluated together at most (about 0.5 GB of columns and values)."""
CHUNK = 8
"""Device counts enumerated together once ``top`` layouts fit (the bound is re-read
between chunks)."""


@dataclass(frozen=True)
class _Cut:
    """What a layout must reach to place among the ``top``: ``floor`` tokens/s (the
    ``top``-th best found, less the tie margin), each token ``per_token`` useful FLOPs (the
    fewest of those found); none until ``top`` layouts fit."""

    floor: float = 0.0
    per_token: float = np.inf

    def may_place(self, flops: Any) -> Any:
        """Whether a layout whose FLOP/s are bounded by ``flops`` (array or scalar) may."""
        return np.asarray(flops) / self.per_token >= self.floor

    def placeable(self, ceiling: float, shares: dict[str, float]) -> Callable[[dict], Any]:
        """Which candidates (of columns, broadcast or not) may place, by the FLOP/s
        ceiling of their devices over the FLOPs they execute at least: the useful ones,
        their recompute policy's share again, and the pipeline's fill and drain (the
        step's ``pp - m + (m - 1) / v`` micro-batches idle beside its ``m`` (``(pp - 1) /
        v`` where m >= pp):
        ``costmodel.parallel.timing.step_time``)."""

        def wanted(cols: dict) -> Any:
            redo = sum(np.where(cols["recompute"] == p, s, 0.0) for p, s in shares.items())
            pp, v, m = cols["pp"], cols["pp_interleave"], cols["grad_accum"]
            bubble = 1 + (np.maximum(pp - m, 0) + (np.minimum(m, pp) - 1) / v) / m
            most = cols["gpus"] * ceiling / (self.per_token * self.floor)  # of the product
            return bubble <= most / (1 + redo)

        return wanted


class _Bound:
    """The tokens/s of the ``top`` best fitting layouts found, and the fewest FLOPs per
    token any of them executes (read as a :class:`_Cut`)."""

    def __init__(self, top: int, precision: Any, hardware: Hardware) -> None:
        self.top, self.best, self.per_token = top, np.zeros(0), np.inf
        self.peak = hardware.peak(precision.peak_dtype)

    @property
    def known(self) -> bool:
        return len(self.best) >= self.top

    def cut(self) -> _Cut:
        if not self.known:
            return _Cut()
        return _Cut(float(self.best[-self.top]) / (1 + TIE), self.per_token)

    def add(self, gpus: np.ndarray, values: dict[str, np.ndarray], ok: np.ndarray) -> None:
        tokens = values["tokens_per_s"][ok]
        if len(tokens):
            self.best = np.sort(np.concatenate([self.best, tokens]))[-self.top :]
            flops = values["mfu"][ok] * self.peak * gpus[ok] / tokens
            self.per_token = min(self.per_token, float(np.min(flops)))


def _evaluate_wave(model, train, hardware, parts, budget, found, bound, structures):
    """Evaluate ``parts`` together, every quantity of every layout, and keep in ``found``
    per part those that fit ``budget`` and the wave's smallest peak (what a no-fit answer
    names; its times NaN). Returns how many were valid."""
    cols = _joined(list(parts.values()))
    structures |= _structures(model, train, cols)
    every = evaluate(model, train, hardware, cols)  # the formulas give all at once
    ok = fits(every, budget)
    keep = ok.copy()
    keep[np.argmin(every[PEAK])] = True
    chosen = {k: v[keep] for k, v in cols.items()}
    values = {k: v[keep] for k, v in every.items()}
    fit = ok[keep]
    values.update({k: np.where(fit, values[k], np.nan) for k in TIMES if k in values})
    kept = np.concatenate([[0], np.cumsum(keep)])  # kept rows before each row
    start = 0
    for key, part in parts.items():
        end = start + len(part["tp"])
        here = slice(kept[start], kept[end])
        found[key] = ({k: v[here] for k, v in chosen.items()},
                      {k: v[here] for k, v in values.items()})  # fmt: skip
        start = end
    bound.add(chosen["gpus"], values, fit)
    return len(cols["tp"])


def _valid_parts(model, train, hardware, counts, options, batches, wanted=None):
    """({(batch, count): its valid candidates (those ``wanted`` keeps: ``LayoutGrid.parts``)},
    how many were enumerated), in the order batch by batch, count by count (the order
    rows are ranked in among exact equals)."""
    found, enumerated = {}, 0
    for count in counts:
        grid = layout_grid(model, train, hardware, int(count), options, batches)
        enumerated += len(grid.allowed)
        for size, part in grid.parts(grid.valid(model, train), wanted).items():
            found[size, int(count)] = part
    order = [(int(b), int(c)) for b in batches or [train.batch] for c in counts]
    return {key: found[key] for key in dict.fromkeys(order) if key in found}, enumerated


def first_candidates(model, train, hardware, counts, options, batches) -> dict[str, np.ndarray]:
    """The first candidate enumerated, batch by batch, count by count, before the rules
    (none: empty columns); what a search that found nothing valid names its rule from."""
    for size in batches or [train.batch]:
        for count in counts:
            grid = layout_grid(model, train, hardware, int(count), options, [size])
            if len(grid.allowed):
                return grid.rows(grid.allowed, limit=1)
    return grid.rows(grid.allowed, limit=1)


def _joined(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def evaluate(
    model: ModelSpec, train: TrainSpec, hardware: Hardware, cols: dict[str, np.ndarray],
    quantities: tuple[str, ...] = QUANTITIES,
) -> dict[str, np.ndarray]:  # fmt: skip
    """The planner's ``quantities`` of candidate layouts (checked by the rules already):
    a sweep over the columns (ParallelSpec fields, ``grad_accum``, ``recompute`` and
    ``batch``; other layout fields at their defaults), every other training field as
    ``train`` has it."""
    searched = {k: v for k, v in cols.items() if k in SEARCHED}
    given = {f.name: getattr(train, f.name) for f in fields(train) if f.name not in searched}
    return sweep(model, hardware=hardware, quantities=quantities, checked=True,
                 **given, **searched)  # fmt: skip


def _structures(model: ModelSpec, train: TrainSpec, cols: dict) -> set:
    """The structures of the columns (what ``Plan.structures`` counts): one per distinct
    value of the columns that are structure fields, pipelining and interleaving
    (``quantities.structure_of``'s keys; the other fields as ``train``)."""
    keys = [k for k in (*TRAIN_STRUCTURE, *PARALLEL_STRUCTURE) if k in cols]
    flags = [np.asarray(cols[k]) for k in keys] + [cols["pp"] > 1, cols["pp_interleave"] > 1]
    items = sorted({tuple(_plain(f[i]) for f in flags) for i in _first_of_each(flags)}, key=str)
    return set(items)


def _first_of_each(flags: list[np.ndarray]) -> list[int]:
    """The first index of each distinct combination of the arrays' values."""
    code, space = np.zeros(len(flags[0]), dtype=np.int64), 1
    for key in flags:
        inverse, n = factorize(key)
        code, space = code * n + inverse, space * n
    small = code.astype(np.uint16) if space <= 2**16 else code  # a radix sort for 16 bits
    _, first = np.unique(small, return_index=True)
    return [int(i) for i in first]


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
