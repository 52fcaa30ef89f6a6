"""The candidate layouts of a cluster, and the rules that keep the valid ones.

Enumerates, for ``gpus`` devices, every framework the user allows with its sharding
(FSDP2: fsdp shards x dp replicas; Megatron: data parallel with the distributed
optimizer; DeepSpeed and the reference model: ZeRO 1/2/3 over all replicas), tensor
parallelism within a node (with and without sequence parallelism), pipeline parallelism
(plain and interleaved 1F1B, uneven stages included), context parallelism, expert
parallelism, the micro-batch per device and the recompute policy, as numpy columns; the
spec layer's own rules (``config.check`` inside ``checks.collect_masks``) mask the invalid
ones. ``costmodel.engine.plan`` evaluates and ranks what is left.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, fields
from types import SimpleNamespace

import numpy as np
import sympy as sp

from costmodel.config import check
from costmodel.engine.fit import DEFAULT_HEADROOM, check_headroom
from costmodel.frameworks.registry import framework_defaults, framework_of, trait
from costmodel.kinds import ffn
from costmodel.parallel.dispatch import DISPATCHERS
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import (
    EP_DISPATCHERS,
    FRAMEWORKS,
    ParallelSpec,
    expert_tp,
    grad_accum_of,
)

FRAMEWORK_CHOICES = tuple(name for name in FRAMEWORKS if trait(name, "planned"))
OBJECTIVES = ("time", "cost", "tokens-per-gpu", "mfu")


@dataclass(frozen=True)
class PlanOptions:
    """What the search may vary; every field is a list of allowed values."""

    frameworks: tuple[str, ...] = ("fsdp2", "megatron")
    recompute: tuple[str, ...] = ("none", "selective", "selective-op", "full")
    micro_batches: tuple[int, ...] | None = None
    """Sequences per device per micro-batch; default every power of two that divides."""
    interleave: tuple[int, ...] = (1, 2)
    max_tp: int | None = None
    """Largest tensor-parallel degree; default the devices of one node (NVLink domain)."""
    memory_headroom: float = DEFAULT_HEADROOM
    """A layout fits when its peak allocated bytes are at most this share of device
    memory (:mod:`costmodel.engine.fit`)."""
    dispatchers: tuple[str, ...] = ("all-to-all",)
    """Expert-parallel token dispatchers to try (``ParallelSpec.ep_dispatcher``; DeepEP's
    and HybridEP's on GPUs only)."""
    objective: str = "time"
    """What ranks the layouts that fit (``OBJECTIVES``): ``time``, the most tokens per
    second (the shortest step at one batch); ``cost``, the fewest device-seconds per token
    (the most tokens per second per device: what a budget's smaller counts may win; on one
    device kind ``tokens-per-gpu`` ranks the same, across kinds cost weighs each kind's
    price: ``costmodel.cli.plan_compare``); ``mfu``,
    the highest model FLOPs utilisation."""

    def __post_init__(self) -> None:
        for name in ("frameworks", "recompute", "micro_batches", "interleave", "dispatchers"):
            if getattr(self, name) is not None:  # lists from callers become tuples (hashable)
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("frameworks", "recompute", "dispatchers"):
            values = getattr(self, name)
            if not values:
                raise SpecError(name, f"{name} must name at least one choice")
        for fw in self.frameworks:
            checks.choice("frameworks", fw, FRAMEWORK_CHOICES)
        for kind in self.dispatchers:
            checks.choice("ep_dispatchers", kind, EP_DISPATCHERS)
        for rc in self.recompute:
            checks.choice("recompute", rc, ("none", "selective", "selective-op", "full"))
        for mb in self.micro_batches or ():
            checks.integer("micro_batches", mb)
        for v in self.interleave:
            checks.integer("interleave", v)
        if self.max_tp is not None:
            checks.integer("max_tp", self.max_tp)
        check_headroom(self.memory_headroom)
        checks.choice("objective", self.objective, OBJECTIVES)


def device_counts(max_gpus: int, per_node: int) -> list[int]:
    """The device counts a budget of ``max_gpus`` searches: every count up to one node, then
    whole nodes whose count has no prime factor above 5 (64, 72, 75, 80, ... nodes), the
    counts a layout of small-prime degrees fills; a prime node count such as 641 (5,128
    GPUs) would leave its layouts a pipeline of 641 stages or nothing. Bounded: 12,500
    nodes give 191 counts."""
    checks.integer("max_gpus", max_gpus)
    if max_gpus <= per_node:
        return list(range(1, max_gpus + 1))
    nodes = [n for n in range(1, max_gpus // per_node + 1) if _smooth(n)]
    return sorted({*range(1, per_node), *(per_node * n for n in nodes)})


def batch_choices(low: int, high: int, keep: int = 8) -> list[int]:
    """The global batches a range searches: the ``keep`` largest in [low, high] with no
    prime factor above 7 (batches are chosen to split evenly: 2,520 = 2^3 3^2 5 7), and
    ``high`` itself. A SpecError naming ``global_batch`` for an empty or reversed range."""
    checks.integer("global_batch", low)
    checks.integer("global_batch", high)
    if low > high:
        raise SpecError("global_batch", f"global_batch range {low}:{high} has min > max")
    found, b = [], high
    while b >= low and len(found) < keep:
        if b == high or _smooth(b, (2, 3, 5, 7)):
            found.append(b)
        b -= 1
    return sorted(found)


def _smooth(n: int, primes: tuple[int, ...] = (2, 3, 5)) -> bool:
    for p in primes:
        while n % p == 0:
            n //= p
    return n == 1


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in increasing order, from its prime factors (sympy's
    ``divisors``: instant for any count up to 2^53, where a scan up to n would not end)."""
    return tuple(int(d) for d in sp.divisors(n))


def enumerate_layouts(
    model: ModelSpec, train: TrainSpec, hardware: Hardware, gpus: int, options: PlanOptions
) -> dict[str, np.ndarray]:
    """Every combination of the searched fields (before the rules), as columns. Blocks of
    (framework, sharding, tp, pp, cp, ep) are listed in Python; the choices inside a block
    (sp, interleave, micro-batch, recompute) are numpy products shared between blocks."""
    max_tp = options.max_tp or hardware.devices_per_node
    blocks, inner = [], []
    for fw, tp, cp in itertools.product(options.frameworks, _divisors(gpus), _divisors(gpus)):
        if tp > max_tp or gpus % (tp * cp):
            continue
        for pp in _divisors(gpus // (tp * cp)):
            replicas = gpus // (tp * cp * pp)
            if pp > model.n_layers or train.batch % replicas:
                continue
            choices = _choices(tp > 1, pp > 1, train.batch // replicas, options)
            for (dp, fsdp, zero), (ep, etp) in itertools.product(
                framework_of(fw).shardings(replicas), _expert_meshes(model, tp, replicas * cp)
            ):
                blocks.append((fw, zero, dp, fsdp, tp, pp, cp, ep, etp,
                               len(choices["recompute"])))  # fmt: skip
                inner.append(choices)
    names = ("framework", "zero", "dp", "fsdp", "tp", "pp", "cp", "ep", "etp", "count")
    per_block = dict(zip(names, zip(*blocks, strict=True), strict=True)) if blocks else {}
    counts = np.array(per_block.get("count", ()), dtype=np.int64)
    cols = {n: np.repeat(np.array(per_block.get(n, ()), KIND if n in _KINDS else np.int64),
                         counts) for n in names[:-1]}  # fmt: skip
    for n in ("sequence_parallel", "pp_interleave", "micro_batch", "recompute"):
        cols[n] = np.concatenate([c[n] for c in inner] or [np.zeros(0, np.int64)])
    cols["sequence_parallel"] = cols["sequence_parallel"].astype(bool)
    cols["grad_accum"] = grad_accum_of(
        train.batch, cols["dp"], cols["fsdp"], cols["micro_batch"], field="micro_batch"
    )
    cols.update(framework_defaults(cols["framework"]))  # each candidate framework's own
    size = len(cols["tp"])
    cols.update(gpus=np.full(size, gpus, np.int64), batch=np.full(size, train.batch, np.int64))
    cols = _with_dispatchers(_with_ep_overlap(cols), options.dispatchers, hardware)
    cols["framework"].flags.writeable = False  # the rules' traits reuse their compares
    return cols


def _with_dispatchers(cols: dict, dispatchers: tuple[str, ...], hw: Hardware) -> dict:
    """Each expert-parallel candidate once per dispatcher asked for (``PlanOptions``);
    the others keep the spec's default (they dispatch nothing). DeepEP and HybridEP send
    over NVLink and RDMA: GPUs only."""
    if hw.kind != "gpu" and any(DISPATCHERS[d].dedup for d in dispatchers):
        asked = ", ".join(dispatchers)
        raise SpecError("ep_dispatchers", f"ep_dispatchers {asked}: DeepEP and HybridEP run "
                        f"on NVIDIA GPUs; on a {hw.kind} use all-to-all")  # fmt: skip
    first, *others = dispatchers
    routed = cols["ep"] > 1
    cols["ep_dispatcher"] = np.full(len(routed), "all-to-all", dtype=KIND)
    cols["ep_dispatcher"][routed] = first
    n = int(routed.sum())
    if not n or not others:
        return cols
    twins = [{**{k: v[routed] for k, v in cols.items()},
              "ep_dispatcher": np.full(n, d, dtype=KIND)} for d in others]  # fmt: skip
    return {k: np.concatenate([cols[k], *(t[k] for t in twins)]) for k in cols}


def _with_ep_overlap(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each Megatron expert-parallel candidate once more with combined 1F1B
    (``ep_overlap``; the rules drop the twins Megatron would not run): it hides all-to-alls
    but keeps one chunk more in flight under interleaving, so either may be the fastest
    that fits."""
    cols["ep_overlap"] = np.zeros(len(cols["tp"]), dtype=bool)
    again = (cols["ep"] > 1) & trait(cols["framework"], "combined_1f1b")
    if not again.any():
        return cols
    twin = {k: v[again] for k, v in cols.items()}
    twin["ep_overlap"] = np.ones(int(again.sum()), dtype=bool)
    return {k: np.concatenate([cols[k], twin[k]]) for k in cols}


_KINDS = {"framework", "recompute", "ep_dispatcher"}
KIND = np.dtype("<U16")
"""The candidates' kind columns: fixed-width text (compared in C, unlike Python objects;
wide enough for every framework, recompute and dispatcher name)."""
SEARCHED = {*(f.name for f in fields(ParallelSpec)), "grad_accum", "recompute", "batch"}
"""Columns a candidate sets; the rest of the training is the question's."""


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
            for ep in _divisors(model.n_experts) if ranks % (ep * etp) == 0]  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _choices(tp: bool, pp: bool, per_replica: int, options: PlanOptions) -> dict:
    """The choices inside one block: sp (with tp), interleave (with pp), micro-batch, recompute."""
    sps = (False, True) if tp else (False,)
    vs = options.interleave if pp else (1,)
    rows = list(itertools.product(sps, vs, _micro_batches(per_replica, options), options.recompute))
    sp_, v, mb, rc = zip(*rows, strict=True) if rows else ((),) * 4
    return {
        "sequence_parallel": np.array(sp_, bool),
        "pp_interleave": np.array(v, np.int64),
        "micro_batch": np.array(mb, np.int64),
        "recompute": np.array(rc, dtype=KIND),
    }


def _micro_batches(per_replica: int, options: PlanOptions) -> list[int]:
    allowed = options.micro_batches
    if allowed is None:
        allowed = [2**i for i in range(per_replica.bit_length())]
    return [mb for mb in allowed if per_replica % mb == 0]


def candidates(
    cols: dict[str, np.ndarray], train: TrainSpec
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """(layout, training) of every candidate: the layout's fields from the columns (the
    rest at ParallelSpec's defaults), ``train``'s with the searched recompute policy and
    gradient accumulation."""
    par = {f.name: cols.get(f.name, f.default) for f in fields(ParallelSpec)}
    par["etp"] = expert_tp(par["tp"], par["etp"])
    given = {f.name: getattr(train, f.name) for f in fields(train)}
    searched = {k: cols[k] for k in ("recompute", "grad_accum", "batch") if k in cols}
    return SimpleNamespace(**par), SimpleNamespace(**{**given, **searched})


def valid_mask(cols: dict[str, np.ndarray], model: ModelSpec, train: TrainSpec) -> np.ndarray:
    """The candidates every rule accepts (``costmodel.config.check``, as for one input)."""
    par, per_candidate = candidates(cols, train)
    with checks.collect_masks() as masks:
        check(model, per_candidate, par)
    return checks.passing(masks, len(cols["tp"]))


def no_layout_message(
    cols: dict[str, np.ndarray], model: ModelSpec, train: TrainSpec, gpus: int
) -> str:
    """Why nothing is valid: the rule the simplest candidate breaks, in its own words."""
    if not len(cols["tp"]):
        return (f"no layout of {gpus} GPUs splits batch {train.batch}: the global batch must "
                "be a multiple of the data-parallel degree of some layout")  # fmt: skip
    first = {k: v[:1] for k, v in cols.items()}
    try:
        par, per_candidate = candidates(first, train)
        check(model, per_candidate, par)
    except SpecError as err:
        return f"no valid layout of {gpus} GPUs for this model and batch (e.g. {err})"
    return f"no valid layout of {gpus} GPUs for this model and batch"
