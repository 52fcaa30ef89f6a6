"""The fastest layout that fits: every valid layout of a cluster, evaluated at once.

The candidates (``costmodel.engine.layouts``: every framework the user allows with its
sharding, tp within a node with and without SP, pp plain and interleaved, cp, ep, the
micro-batch and the recompute policy) are filtered by the spec layer's own rules
(``checks.collect_masks``: the rules that reject a bad input), ``sweep`` evaluates
per-device memory and step time with the same formulas as ``estimate`` (one call per
structure, on its columns), layouts that break the fit rule (:mod:`costmodel.engine.fit`: the
peak within the memory headroom) are dropped, and the rest are ranked by step time.
Units: seconds, bytes.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from costmodel.config import check
from costmodel.engine.fit import budget_bytes, fits
from costmodel.engine.grid import candidates
from costmodel.engine.layouts import no_layout_message
from costmodel.engine.options import FRAMEWORK_CHOICES as FRAMEWORK_CHOICES  # re-exported
from costmodel.engine.options import PlanOptions as PlanOptions  # re-exported
from costmodel.engine.row_words import layout_label as layout_label  # re-exported
from costmodel.engine.row_words import limit_of as limit_of  # re-exported
from costmodel.engine.search import QUANTITIES as QUANTITIES  # re-exported
from costmodel.engine.search import TIE as TIE  # re-exported
from costmodel.engine.search import collect, collect_top, evaluate, first_candidates
from costmodel.engine.sweep import Table
from costmodel.kinds import ffn
from costmodel.specs import checks
from costmodel.specs.checks import SpecError, UnknownKey
from costmodel.specs.frameworks import trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.specs.rules import check_positions

LAYOUT = ("gpus", "batch", "framework", "zero", "dp", "fsdp", "tp", "sequence_parallel", "pp",
          "pp_interleave", "cp", "ep", "etp", "ep_dispatcher", "micro_batch", "grad_accum",
          "recompute",
          "grad_reduce_fp32", "ep_overlap")  # fmt: skip


class RankedValues(dict):
    """A plan's quantities of every candidate by key (``plan.values["mfu"]``), also called
    as a Mapping's ``values()`` is: the ranked columns of ``keys()`` (``plan[k]`` each)."""

    plan: Plan

    def __call__(self) -> list[np.ndarray]:
        return [self.plan[k] for k in self.plan]


@dataclass(repr=False)
class Plan:
    """Every valid candidate with its quantities; ``order`` ranks the fitting ones, best
    first by the objective with near-ties broken as :func:`rank` says (:func:`ranking_text`
    in words: so a row may be a little slower than one below it).

    Dict-like over the ranked table's columns (``plan["time_s.step"]``: the fitting
    layouts' step times in rank order; ``in``, ``keys()``, ``items()``); ``table()`` gives
    every column, and a notebook shows the top layouts, or why none fits."""

    model: ModelSpec
    train: TrainSpec
    hardware: Hardware
    gpus: int
    options: PlanOptions
    columns: dict[str, np.ndarray]
    values: dict[str, np.ndarray]
    fits: np.ndarray
    order: np.ndarray
    enumerated: int
    valid: int
    """Candidates every rule accepts that were evaluated (a top search leaves out those
    its bound shows cannot place, and keeps the rows of those that fit)."""
    budget_bytes: float
    structures: int = field(default=0)
    skipped: tuple[int, ...] = field(default=())
    """Device counts a top search left out: none of their layouts could rank among its
    top rows (:mod:`costmodel.engine.search`)."""
    nearest: dict[str, Any] | None = None
    """Where none fits and ``nearest_searched``: the nearest layout that does
    (``costmodel.engine.why.nearest_fitting``; None: none up to 8x the devices)."""
    nearest_searched: bool = False
    caveats: list[str] = field(default_factory=list)
    """What the CLI cautions of the best layout (``costmodel.engine.caveats.plan_caveats``:
    filled by ``costmodel.plan``), shown in the repr."""

    def __post_init__(self) -> None:
        ranked = RankedValues(self.values)
        ranked.plan = self
        self.values = ranked

    def row(self, i: int) -> dict[str, Any]:
        """One candidate (an index of ``columns``; ``order`` lists the fitting ones best
        first): its layout, quantities and what limits it."""
        self._candidate(i)
        out = {k: _plain(self.columns[k][i]) for k in LAYOUT}
        out.update({k: float(self.values[k][i]) for k in QUANTITIES})
        out["fits"] = bool(self.fits[i])
        out["limit"] = limit_of(out, self.budget_bytes, self.hardware.hbm_bytes)
        return out

    def top(self, k: int = 10) -> list[dict[str, Any]]:
        """The ``k`` best fitting layouts as rows (:meth:`row`), in rank order."""
        checks.integer("k", k, minimum=0)  # a slice would take -2 as "all but the last two"
        return [self.row(int(i)) for i in self.order[:k]]

    def smallest_memory(self) -> dict[str, Any]:
        return self.row(int(np.argmin(self.values["memory_bytes_per_device.peak"])))

    def _candidate(self, i: int) -> None:
        """``i`` names a candidate (an index of ``columns``, not a rank: a probe read
        ``parallel_spec(0)`` as the best, which ``order[0]`` is)."""
        n = len(self.fits)
        checks.integer("i", i, minimum=0)
        if i >= n:
            raise SpecError("i", f"row i must be below the {n:,} candidates (got {i:,}); "
                            "plan.order ranks those that fit (the best: plan.order[0]), "
                            "plan.top(k) the best rows")  # fmt: skip

    def parallel_spec(self, i: int) -> ParallelSpec:
        """The layout of candidate ``i`` (an index of ``columns``; the best is
        ``order[0]``) as ``estimate`` takes it."""
        self._candidate(i)
        c = {k: _plain(self.columns[k][i]) for k in LAYOUT}
        return ParallelSpec(**{k: c[k] for k in ParallelSpec.__dataclass_fields__ if k in c})

    def train_spec(self, i: int) -> TrainSpec:
        """The training of candidate ``i`` (its batch, accumulation and recompute)."""
        self._candidate(i)
        ga, rc = int(self.columns["grad_accum"][i]), str(self.columns["recompute"][i])
        return self.train.replace(grad_accum=ga, recompute=rc, batch=int(self.columns["batch"][i]))

    def table(self, k: int | None = None) -> Any:
        """The ``k`` best fitting layouts (all by default), in rank order, as columns:
        ``rank``, the layout (``LAYOUT``), ``label``, ``limit`` and ``QUANTITIES`` (seconds,
        bytes). A :class:`~costmodel.engine.sweep.Table`: ``.frame()`` for pandas."""
        if k is not None:
            checks.integer("k", k, minimum=0)
        idx = self.order[:k]
        cols: dict[str, Any] = {"rank": np.arange(1, len(idx) + 1)}
        cols.update({name: self.columns[name][idx] for name in LAYOUT})
        rows = [self.row(int(i)) for i in idx]
        cols["label"] = np.array([layout_label(r) for r in rows], dtype=object)
        cols["limit"] = np.array([r["limit"] for r in rows], dtype=object)
        cols.update({name: self.values[name][idx] for name in QUANTITIES})
        return Table(cols)

    def __getitem__(self, key: str) -> np.ndarray:
        if key in LAYOUT:
            return self.columns[key][self.order]
        if key in QUANTITIES:
            return self.values[key][self.order]
        raise UnknownKey(key, checks.unknown("column", key, self.keys(), "plan.keys() lists them"))

    def __contains__(self, key: object) -> bool:
        return key in LAYOUT or key in QUANTITIES

    def keys(self) -> list[str]:
        return [*LAYOUT, *QUANTITIES]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def items(self) -> list[tuple[str, np.ndarray]]:
        return [(k, self[k]) for k in self.keys()]

    def __len__(self) -> int:
        return len(self.order)

    def summary(self, k: int = 5) -> list[str]:
        """The search in a line, how it ranks, then the ``k`` best fitting layouts (or why
        none fits: :func:`no_fit_text`)."""
        counts = np.unique(self.columns["gpus"]) if len(self.columns["gpus"]) else ()
        on = f"up to {self.gpus}" if len(counts) > 1 else f"{self.gpus}"
        batches = np.unique(self.columns["batch"]) if len(self.columns["batch"]) else ()
        batch = (f"batch {batches[0]:,}..{batches[-1]:,}" if len(batches) > 1 else
                 f"batch {self.train.batch:,}")  # fmt: skip
        head = (f"{self.model.name} on {on} x {self.hardware.name}: {batch} x seq "
                f"{self.train.seq}; {self.enumerated:,} layouts, {self.valid:,} valid, "
                f"{len(self):,} fit in {self.budget_bytes / 2**30:,.1f} GiB")  # fmt: skip

        def each(r: dict[str, Any]) -> str:  # what varies between rows: GPUs, batch
            return "".join([f"{r['gpus']:,} GPUs, " * (len(counts) > 1),
                            f"batch {r['batch']:,}, " * (len(batches) > 1)])  # fmt: skip

        rows = [f"{n}. {layout_label(r)}: {each(r)}step {r['time_s.step']:.4g} s, MFU "
                f"{r['mfu']:.1%}, peak {r['memory_bytes_per_device.peak'] / 2**30:,.1f} GiB; "
                f"{r['limit']}" for n, r in enumerate(self.top(k), 1)]  # fmt: skip
        if not rows:
            searched = [nearest_words(self.nearest)] if self.nearest_searched else []
            return [head, no_fit_text(self, hints=not self.nearest_searched), *searched]
        return [head, ranking_text(self.options.objective), *rows]

    def __repr__(self) -> str:
        lines = [*self.summary(), *(f"caveat: {c}" for c in self.caveats)]
        return "\n".join(["Plan(", *(f"  {line}" for line in lines), ")"])

    def _repr_html_(self) -> str:
        head, said, *rows = self.summary()  # the search, how it ranks (or why none fits)
        items = "".join(f"<li>{html.escape(r.split('. ', 1)[-1])}</li>" for r in rows)
        said_too = "".join(f"<p>caveat: {html.escape(c)}</p>" for c in self.caveats)
        return (f"<div><p>{html.escape(head)}</p><p>{html.escape(said)}</p>"
                f"<ol style='margin:0'>{items}</ol>{said_too}</div>")  # fmt: skip


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both ``x`` and ``y`` (lower is better;
    of equal points, the first), by increasing ``x``: layouts on peak memory and step time,
    GPU counts on days and GPU-hours (:mod:`costmodel.engine.sizing`)."""
    order = np.lexsort((y, x))
    best = np.minimum.accumulate(y[order])
    keep = np.r_[True, best[1:] < best[:-1]]
    return order[keep]


def plan(
    model: ModelSpec,
    train: TrainSpec,
    hardware: Hardware,
    gpus: int | Sequence[int],
    options: PlanOptions | None = None,
    batches: Sequence[int] | None = None,
    top: int | None = None,
) -> Plan:
    """Search every layout of ``gpus`` devices (or of each count in a sequence, e.g.
    :func:`~costmodel.engine.layouts.device_counts` of a budget) for ``train.batch``
    sequences of ``train.seq`` tokens (``train``'s precision, kernels and optimizer are
    kept; its grad_accum and recompute are searched). ``Plan.gpus`` is the largest count;
    each row's ``gpus`` its own. ``batches`` (e.g.
    :func:`~costmodel.engine.layouts.batch_choices` of a range) searches each of those
    global batches in place of ``train.batch``; each row's ``batch`` is its own.

    With ``top``, only the ``top`` best rows are asked for (the CLI's table): layouts that
    do not fit get their memory and no time (NaN), and device counts that cannot place a
    layout among the ``top`` are skipped (``Plan.skipped``; :mod:`costmodel.engine.search`).
    The ``top`` rows are those of the whole search."""
    options = options or PlanOptions()
    counts = [gpus] if isinstance(gpus, int | np.integer) else list(gpus)
    for count in counts:
        checks.integer("gpus", count)
    if top is not None:
        checks.integer("top", top)
    check_positions(model.pos, train.seq, model.max_positions)
    _runs_somewhere(options, hardware)
    if not ffn.routes(model) and set(options.dispatchers) - {"all-to-all"}:  # as estimate
        raise SpecError("ep_dispatchers", "ep_dispatchers pick how tokens travel between "
                        f"expert-parallel ranks: {model.name} has no routed experts")  # fmt: skip
    budget = budget_bytes(hardware, options.memory_headroom)
    if top is None:
        found = collect(model, train, hardware, counts, options, batches)
    else:
        found = collect_top(model, train, hardware, counts, options, batches, budget, top)
    if not found.cols:
        first = first_candidates(model, train, hardware, counts, options, batches)
        raise SpecError("gpus", no_layout_message(first, model, train, max(counts),
                                                  options.micro_batches))  # fmt: skip
    fitting = fits(found.values, budget)
    order = rank(found.cols, found.values, np.flatnonzero(fitting), options.objective,
                 hardware.hbm_bytes)  # fmt: skip
    return Plan(model, train, hardware, int(max(counts)), options, found.cols, found.values,
                fitting, order, found.enumerated, found.valid, budget, found.structures,
                found.skipped)  # fmt: skip


def _runs_somewhere(options: PlanOptions, hardware: Hardware) -> None:
    """At least one framework asked for runs on the device: on a TPU the CUDA-only ones
    (Megatron, DeepSpeed) are left out of the search, so asking only for them is the
    estimate's refusal, not "no layout splits the batch" (a probe)."""
    if hardware.kind == "tpu" and all(trait(f, "cuda_only") for f in options.frameworks):
        verb = "runs" if len(options.frameworks) == 1 else "run"
        raise SpecError("frameworks", f"{', '.join(options.frameworks)} {verb} on CUDA GPUs, "
                        f"not on {hardware.name}: on a TPU plan --frameworks fsdp2 "
                        "(MaxText's FSDP, as the TPU runs the catalog checks)")  # fmt: skip


def evaluate_layout(
    model: ModelSpec, train: TrainSpec, parallel: ParallelSpec, hardware: Hardware
) -> dict[str, float]:
    """One layout as the planner evaluates a candidate: refused by the rules that filter
    the candidates (a SpecError naming the field), else its ``QUANTITIES``."""
    cols = {f.name: np.array([getattr(parallel, f.name)]) for f in fields(parallel)}
    cols.update(recompute=np.array([train.recompute]), grad_accum=np.array([train.grad_accum]))
    par, per_candidate = candidates(cols, train)
    with checks.collect_masks() as masks:
        check(model, per_candidate, par)
    refused = checks.refusal(masks, 0)
    if refused is not None:
        raise refused
    return {k: float(v[0]) for k, v in evaluate(model, train, hardware, cols).items()}


def score(cols: dict[str, np.ndarray], values: dict[str, np.ndarray], objective: str):
    """What ``objective`` minimises, per layout (``PlanOptions.objective``): seconds per
    token (``time``; the step time's order at one batch), device-seconds per token
    (``cost``, and ``tokens-per-gpu``: the same order on one device kind), 1 / MFU
    (``mfu``)."""
    per_token = 1 / values["tokens_per_s"]
    per_device = cols["gpus"] * per_token
    return {"time": per_token, "cost": per_device, "tokens-per-gpu": per_device,
            "mfu": 1 / values["mfu"]}[objective]  # fmt: skip


def rank(
    cols: dict[str, np.ndarray],
    values: dict[str, np.ndarray],
    idx: np.ndarray,
    objective: str = "time",
    capacity: float = np.inf,
) -> np.ndarray:
    """``idx`` best first by ``objective`` (:func:`score`); ties (``TIE``) go to the layout
    on fewer devices (a budget's search; by cost or tokens per GPU, on more: as cheap and
    sooner, :func:`device_tie`), then with the fewest model-parallel devices (tp x pp x cp:
    fewer collectives on the critical path, fewer ways to go wrong), then with the smaller
    peak memory. A layout whose reserved bytes (the caching allocator's,
    ``engine.fit``) exceed the device's ``capacity`` ranks after every one that does not:
    its peak fits the budget, but the allocator would retry and may run out."""
    key = score(cols, values, objective)
    idx = idx[np.argsort(key[idx], kind="stable")]
    best = key[idx]
    tier = np.empty(len(idx), dtype=np.int64)
    start, n = 0, 0
    while start < len(idx):  # a tier: every layout within TIE of the best not yet placed
        end = int(np.searchsorted(best, best[start] * (1 + TIE), side="right"))
        tier[start:end], start, n = n, end, n + 1
    split = (cols["tp"] * cols["pp"] * cols["cp"])[idx]
    peak = values["memory_bytes_per_device.peak"][idx]
    at_risk = values["memory_bytes_per_device.reserved"][idx] > capacity
    gpus = cols["gpus"][idx] * (1 if device_tie(objective) == "fewer devices" else -1)
    return idx[np.lexsort((best, peak, split, gpus, tier, at_risk))]


def device_tie(objective: str) -> str:
    """Which device count a near-tie goes to: fewer by time or MFU (the same speed on fewer
    devices), more by cost or tokens per GPU (the same cost, sooner: fewer devices had
    ranked a 3,816-day run over an as cheap 951-day one, a probe)."""
    return "more devices" if objective in ("cost", "tokens-per-gpu") else "fewer devices"


RANKED_BY = {"time": "time (the most tokens/s)",
             "cost": "cost (the fewest device-seconds per token; dollars with a price and a "
                     "token budget)",
             "tokens-per-gpu": "tokens/s per GPU", "mfu": "MFU"}  # fmt: skip
"""What ranks a plan's rows, per ``PlanOptions.objective``, in words."""


def ranking_text(objective: str) -> str:
    """:func:`rank`'s rule in words, for a reader who sees a row a little slower than the
    one below it."""
    return (
        f"ranked by {RANKED_BY[objective]}; within {TIE:.1%} of each other by "
        f"{device_tie(objective)}, then fewer model-parallel ones (tp x pp x cp), then the "
        "smaller peak; "
        "a layout whose reserved memory exceeds the device's ranks after all that do not"
    )


def no_fit_text(p: Plan, hints: bool = True, name: Callable[[str], str] = str) -> str:
    """No layout fits: the smallest peak found and (``hints``) what could make one fit;
    without them where the nearest fitting layout is given instead. ``name`` spells an
    input (the CLI's ``--recompute``; the Python keyword ``recompute`` by default)."""
    best = p.smallest_memory()
    need = best["memory_bytes_per_device.peak"]
    tuning = p.train.finetune != "full"  # fine-tuning shards over fsdp only
    tries = ["more GPUs" + ("" if tuning else " (or more pp/tp to split the weights)")]
    if tuning and p.train.finetune == "lora":
        tries.append(f"{name('finetune')} qlora (4-bit frozen weights)")
    if best["recompute"] != "full" and "full" not in p.options.recompute:
        tries.insert(0, f"allow {name('recompute')} full")
    if best["micro_batch"] > 1:
        tries.insert(0, "a smaller micro-batch")
    hbm = p.hardware.hbm_bytes / 2**30
    text = (f"no layout fits: the smallest peak is {need / 2**30:,.1f} GiB per device "
            f"({layout_label(best)}) against {p.budget_bytes / 2**30:,.1f} GiB "
            f"({p.options.memory_headroom:.0%} of {hbm:,.0f} GiB)")  # fmt: skip
    return f"{text}; try {', or '.join(tries)}" if hints else text


def nearest_words(row: dict[str, Any] | None) -> str:
    """The nearest layout that fits (``costmodel.engine.why.nearest_fitting``'s row, or None
    for none) in the words the CLI's plan, the Plan page and a Plan's repr share."""
    if row is None:
        return "nothing fits on up to 8x the devices with every option the search allows"
    changes = ", ".join(row["changes"]) or "wider search options"
    gpus = f"{row['gpus']:,} GPU{'s' * (row['gpus'] != 1)}"  # engine sits below units
    return (f"nearest that fits: {changes}: {layout_label(row)} on {gpus}, "
            f"step {row['time_s.step']:.3f} s, peak "
            f"{row['memory_bytes_per_device.peak'] / 2**30:,.1f} GiB")  # fmt: skip


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
