"""The candidate layouts of one device count, factored: what the planner enumerates.

A candidate is a *block* (framework, sharding ``dp``/``fsdp``/``zero``, ``tp``, ``pp``,
``cp`` and the expert mesh ``ep``/``etp``) with the choices inside it (sequence parallelism,
interleaving, micro-batch, recompute), for one global batch, once more with Megatron's
combined 1F1B and once per further dispatcher where the block is expert-parallel. Each of
these is an axis of its own, so the rule table (``costmodel.config.check``, elementwise
numpy) runs each rule at the size of the fields it reads: a rule on ``tp`` and ``cp`` once
per block, one on ``recompute`` once per policy. The verdict is taken in two steps: the
outer cells (batch, dispatcher, combined 1F1B, block) that pass the rules on those axes,
then the inner choices of those cells only (:meth:`LayoutGrid.select`). A search of
Turing-NLG 530B on 5,120 GPUs over eight batches enumerates 7.1 M candidates, 1.5 M valid,
from a few thousand blocks.

Valid candidates become columns in the order of :data:`AXES` (C order), the order the
planner ranks exact equals in.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from types import SimpleNamespace

import numpy as np

from costmodel.config import check
from costmodel.engine.options import PlanOptions
from costmodel.kinds import ffn
from costmodel.kinds.dispatch import DISPATCHERS
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import framework_defaults, trait, traits_of
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec, expert_tp, grad_accum_of

AXES = ("batch", "ep_dispatcher", "ep_overlap", "block", "sequence_parallel",
        "pp_interleave", "micro_batch", "recompute")  # fmt: skip
"""The grid's axes, outermost first."""
BLOCK = ("framework", "zero", "dp", "fsdp", "tp", "pp", "cp", "ep", "etp")
"""The fields of a block."""
KIND = np.dtype("<U16")
"""The candidates' kind columns: fixed-width text (compared in C, unlike Python objects;
wide enough for every framework, recompute and dispatcher name)."""
SEARCHED = {*(f.name for f in fields(ParallelSpec)), "grad_accum", "recompute", "batch"}
"""Columns a candidate sets; the rest of the training is the question's."""


OUTER = AXES.index("block") + 1
"""The grid's outer axes (batch, dispatcher, combined 1F1B, block): most rules read only
them, and few of their cells survive those rules (a fifth of Turing-NLG's on 5,120 GPUs)."""


@dataclass
class Selection:
    """Candidates of a grid: the outer ``cells`` any of them is in (one index array per
    outer axis, in C order) and, per cell, which of the inner choices (sequence
    parallelism, interleaving, micro-batch, recompute) are in (``inner``)."""

    cells: tuple[np.ndarray, ...]
    inner: np.ndarray

    def __len__(self) -> int:
        return int(np.count_nonzero(self.inner))


@dataclass
class LayoutGrid:
    """Candidates of ``gpus`` devices: ``blocks`` (one array per :data:`BLOCK` field), the
    values along every other axis, and ``choices``, what makes a combination one the
    search enumerates (sequence parallelism only with tp, interleaving only with pp,
    micro-batches that divide a replica's share of the batch, twins only of
    expert-parallel blocks), each a bool array on its own axes; ``allowed`` selects them."""

    gpus: int
    blocks: dict[str, np.ndarray]
    axes: dict[str, np.ndarray]
    choices: list[np.ndarray] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.blocks["tp"]) if k == "block" else len(self.axes[k]) for k in AXES)

    @functools.cached_property
    def allowed(self) -> Selection:
        """Every candidate the search enumerates (before the rules)."""
        return self.select(self.choices)

    def along(self, name: str, values: np.ndarray) -> np.ndarray:
        """``values`` on axis ``name`` (one per block or per axis value), shaped to
        broadcast against the grid."""
        shape = [1] * len(AXES)
        shape[AXES.index(name)] = -1
        return np.asarray(values).reshape(shape)

    def columns(self) -> dict[str, np.ndarray]:
        """Every searched field as an array that broadcasts to :attr:`shape` (what the
        rules read)."""
        cols = {k: self.along("block", v) for k, v in self.blocks.items()}
        cols.update({k: self.along(k, v) for k, v in self.axes.items()})
        cols["ep_dispatcher"] = np.where(cols["ep"] > 1, cols["ep_dispatcher"], "all-to-all")
        with checks.collect_masks():  # a micro-batch that does not divide is not allowed
            accum = grad_accum_of(cols["batch"], cols["dp"], cols["fsdp"], cols["micro_batch"],
                                  field="micro_batch")  # fmt: skip
        cols["grad_accum"] = accum
        cols.update(framework_defaults(cols["framework"]))
        cols["gpus"] = np.int64(self.gpus)
        cols["framework"].flags.writeable = False  # the rules' traits reuse their compares
        return cols

    def valid(self, model: ModelSpec, train: TrainSpec) -> Selection:
        """The candidates the search enumerates that pass every rule (``config.check``,
        as for one input)."""
        par, per_candidate = candidates(self.columns(), train)
        # combinations the search does not enumerate (a micro-batch that does not divide
        # gives grad_accum 0) may divide by zero; ``choices`` leave them out
        with checks.collect_masks() as masks, np.errstate(divide="ignore", invalid="ignore"):
            check(model, per_candidate, par)
        return self.select([*self.choices, *(m.ok for m in masks)])

    def select(self, parts: list[np.ndarray]) -> Selection:
        """The candidates where every one of ``parts`` (bool arrays that broadcast to the
        grid) holds: the outer cells where those on outer axes only hold, then, for those
        cells only, the inner choices where the rest hold."""
        norm = [np.reshape(p, (1,) * (len(AXES) - np.ndim(p)) + np.shape(p)) for p in parts]
        outer = [p for p in norm if not any(n > 1 for n in p.shape[OUTER:])]
        keep = checks.conjunction([p.reshape(p.shape[:OUTER]) for p in outer],
                                  self.shape[:OUTER])  # fmt: skip
        cells = np.nonzero(keep)
        picked = []
        for p in (p for p in norm if any(n > 1 for n in p.shape[OUTER:])):
            if any(n > 1 for n in p.shape[:OUTER]):
                at = tuple(c if n > 1 else 0 for c, n in zip(cells, p.shape, strict=False))
                picked.append(p[at])
            else:
                picked.append(p.reshape((1, *p.shape[OUTER:])))
        inner = checks.conjunction(picked, (len(cells[0]), *self.shape[OUTER:]))
        return Selection(cells, inner)

    def rows(self, chosen: Selection, limit: int | None = None) -> dict[str, np.ndarray]:
        """The ``chosen`` candidates (the first ``limit``) as columns, in the order of
        :data:`AXES`."""
        flat = np.flatnonzero(chosen.inner)[:limit]
        cell, *inner = np.unravel_index(flat, chosen.inner.shape)
        at = dict(zip(AXES, [c[cell] for c in chosen.cells] + inner, strict=True))
        block = at["block"]
        cols = {k: v[block] for k, v in self.blocks.items()}
        for name in ("sequence_parallel", "pp_interleave", "micro_batch", "recompute"):
            cols[name] = self.axes[name][at[name]]
        batch = self.axes["batch"][at["batch"]]
        cols["grad_accum"] = grad_accum_of(batch, cols["dp"], cols["fsdp"],
                                           cols["micro_batch"], field="micro_batch")  # fmt: skip
        defaults = framework_defaults(self.blocks["framework"])  # per block, then gathered
        cols.update({k: np.asarray(v)[block] for k, v in defaults.items()})
        cols["gpus"] = np.full(len(flat), self.gpus, np.int64)
        cols["batch"] = batch
        cols["ep_overlap"] = self.axes["ep_overlap"][at["ep_overlap"]]
        sent = np.where(self.blocks["ep"] > 1, self.axes["ep_dispatcher"][:, None], "all-to-all")
        cols["ep_dispatcher"] = sent.astype(KIND)[at["ep_dispatcher"], block]
        cols["framework"].flags.writeable = False
        return cols

    def parts(
        self, chosen: Selection, wanted: Callable[[dict], np.ndarray] | None = None
    ) -> dict[int, dict[str, np.ndarray]]:
        """The ``chosen`` candidates (those of them ``wanted`` keeps, a bool per row) by
        global batch (the batches with any)."""
        cols = self.rows(chosen)
        if wanted is not None:
            keep = wanted(cols)
            cols = cols if keep.all() else {k: v[keep] for k, v in cols.items()}
        ends = np.searchsorted(cols["batch"], self.axes["batch"], side="right").tolist()
        found, start = {}, 0
        for batch, end in zip(self.axes["batch"].tolist(), ends, strict=True):
            if end > start:
                found[batch] = {k: v[start:end] for k, v in cols.items()}
            start = end
        return found


def layout_grid(
    model: ModelSpec, train: TrainSpec, hardware: Hardware, gpus: int, options: PlanOptions,
    batches: Sequence[int] | None = None,
) -> LayoutGrid:  # fmt: skip
    """Every candidate of ``gpus`` devices for each global batch of ``batches`` (default
    ``train.batch``) that ``options`` allows, factored."""
    if hardware.kind != "gpu" and any(DISPATCHERS[d].dedup for d in options.dispatchers):
        asked = ", ".join(options.dispatchers)
        raise SpecError("ep_dispatchers", f"ep_dispatchers {asked}: DeepEP and HybridEP run "
                        f"on NVIDIA GPUs; on a {hardware.kind} use all-to-all")  # fmt: skip
    sizes = np.array(sorted({int(b) for b in batches or [train.batch]}), np.int64)
    b = _blocks(model, hardware, gpus, options, sizes)
    replicas = gpus // (b["tp"] * b["cp"] * b["pp"])
    routed = b["ep"] > 1
    combined = routed & trait(b["framework"], "combined_1f1b")
    interleave = dict.fromkeys((*options.interleave, 1))
    grid = LayoutGrid(gpus, b, {
        "batch": sizes,
        "ep_dispatcher": np.array(options.dispatchers if routed.any() else
                                  options.dispatchers[:1], KIND),
        "ep_overlap": np.array([False, True] if combined.any() else [False]),
        "sequence_parallel": np.array([False, True] if (b["tp"] > 1).any() else [False]),
        "pp_interleave": np.array(list(interleave) if (b["pp"] > 1).any() else [1], np.int64),
        "micro_batch": np.array(_micro_batches(sizes, replicas, options), np.int64),
        "recompute": np.array(options.recompute, KIND),
    })  # fmt: skip
    grid.choices = _choices(grid, replicas, routed, combined, options.interleave)
    return grid


def _choices(grid: LayoutGrid, replicas: np.ndarray, routed: np.ndarray,
             combined: np.ndarray, interleave: tuple[int, ...]) -> list[np.ndarray]:  # fmt: skip
    """What makes a combination one the search enumerates: the batch splits over the
    block's replicas, sequence parallelism only under tp, interleaving (the degrees asked)
    only under pp, micro-batches that split a replica's share (:func:`_split`), a twin
    with combined 1F1B only of a block that runs it, a dispatcher past the first only of
    an expert-parallel block."""
    at, a, b = grid.along, grid.axes, grid.blocks
    batch, replicas = at("batch", a["batch"]), at("block", replicas)
    v = at("pp_interleave", a["pp_interleave"])
    return [
        batch % replicas == 0,
        ~at("sequence_parallel", a["sequence_parallel"]) | at("block", b["tp"] > 1),
        np.where(at("block", b["pp"] > 1), np.isin(v, interleave), v == 1),
        _split(batch // replicas, at("micro_batch", a["micro_batch"])),
        ~at("ep_overlap", a["ep_overlap"]) | at("block", combined),
        at("ep_dispatcher", np.arange(len(a["ep_dispatcher"])) == 0) | at("block", routed),
    ]


def _blocks(model: ModelSpec, hardware: Hardware, gpus: int, options: PlanOptions,
            sizes: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """(framework, sharding, tp, pp, cp, expert mesh) blocks of ``gpus`` devices whose
    replicas split at least one of the batches ``sizes``, as arrays."""
    max_tp = options.max_tp or hardware.devices_per_node
    splits = set().union(*(divisors(int(size)) for size in sizes))  # replica counts that split
    rows = []
    runs = [fw for fw in options.frameworks  # Megatron, DeepSpeed: CUDA GPUs only
            if not (hardware.kind == "tpu" and trait(fw, "cuda_only"))]  # fmt: skip
    for fw, tp, cp in itertools.product(runs, divisors(gpus), divisors(gpus)):
        if tp > max_tp or gpus % (tp * cp):
            continue
        for pp in divisors(gpus // (tp * cp)):
            replicas = gpus // (tp * cp * pp)
            if pp > model.n_layers or replicas not in splits:
                continue
            for (dp, fsdp, zero), (ep, etp) in itertools.product(
                _shardings(fw, replicas), _expert_meshes(model, tp, replicas * cp)
            ):
                rows.append((fw, zero, dp, fsdp, tp, pp, cp, ep, etp))
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(BLOCK)
    return {name: np.array(col, KIND if name == "framework" else np.int64)
            for name, col in zip(BLOCK, cols, strict=True)}  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _shardings(framework: str, replicas: int) -> tuple[tuple[int, int, int], ...]:
    """(dp, fsdp, zero) of ``replicas`` data-parallel devices the framework tries."""
    return tuple(traits_of(framework).shardings(replicas))


def candidates(
    cols: dict[str, np.ndarray], train: TrainSpec
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """(layout, training) of every candidate: the layout's fields from the columns (the
    rest at ParallelSpec's defaults), ``train``'s with the searched recompute policy,
    gradient accumulation and batch."""
    par = {f.name: cols.get(f.name, f.default) for f in fields(ParallelSpec)}
    par["etp"] = expert_tp(par["tp"], par["etp"])
    given = {f.name: getattr(train, f.name) for f in fields(train)}
    searched = {k: cols[k] for k in ("recompute", "grad_accum", "batch") if k in cols}
    return SimpleNamespace(**par), SimpleNamespace(**{**given, **searched})


@functools.lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in increasing order, from its prime factors: trial division
    up to 10^6 (any device count, at once), sympy's ``divisors`` beyond (instant for any
    count up to 2^53, where a scan up to n would not end)."""
    if n >= 10**12:
        import sympy

        return tuple(int(d) for d in sympy.divisors(n))
    found, rest, p = [1], n, 2
    while p * p <= rest:
        power = 0
        while rest % p == 0:
            rest, power = rest // p, power + 1
        found = [d * p**k for d in found for k in range(power + 1)]
        p += 1 if p == 2 else 2
    if rest > 1:  # one prime factor left above the square root
        found += [d * rest for d in found]
    return tuple(sorted(found))


def _expert_meshes(model: ModelSpec, tp: int, data_ranks: int) -> list[tuple[int, int]]:
    """(ep, etp) meshes of the expert layers to try: (1, tp) for a dense model; for an MoE
    model the experts split as the dense layers (etp = tp) or not at all (etp 1, with tp >
    1), and every divisor of the routed experts such that ep x etp divides the stage's
    tp x data-parallel ranks: with etp 1, expert parallelism folded over tensor and data
    parallelism (Megatron-Core's MoE parallel folding, Liu et al. 2025). The layout rules
    drop the meshes a framework does not run or whose expert group does not nest with the
    shard group."""
    if not ffn.routes(model):
        return [(1, tp)]
    ranks = tp * data_ranks
    return [(ep, etp) for etp in dict.fromkeys((tp, 1))
            for ep in divisors(model.n_experts) if ranks % (ep * etp) == 0]  # fmt: skip


def _micro_batches(sizes: np.ndarray, replicas: np.ndarray, options: PlanOptions) -> list[int]:
    """The micro-batches to try: ``options.micro_batches``, or every power of two up to
    the largest replica's share of a batch and every share over a power of two (which
    of them a layout runs is :func:`_split`'s)."""
    if options.micro_batches is not None:
        return list(dict.fromkeys(options.micro_batches))
    counts = np.unique(replicas)
    splits = sizes[:, None] % counts[None, :] == 0
    shares = {int(s) for s in (sizes[:, None] // counts[None, :])[splits]} or {1}
    found = {2**i for i in range(max(shares).bit_length())}
    for share in shares:
        while share % 2 == 0:
            found.add(share)
            share //= 2
        found.add(share)
    return sorted(found)


def _split(share: np.ndarray, micro: np.ndarray) -> np.ndarray:
    """Micro-batches a replica's ``share`` of the batch runs: those that divide it and are
    a power of two or leave a power-of-two count of micro-batches. Calculon searches every
    divisor: 1,923 sequences over 641 replicas run as micro-batch 3 (3 is not a power of
    two), and this keeps that while every other divisor of a share with many (2,520 has
    48) would multiply the layouts evaluated with near-twins of these."""
    count = share // micro
    return (share % micro == 0) & (((micro & (micro - 1)) == 0) | ((count & (count - 1)) == 0))
