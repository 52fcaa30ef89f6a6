"""Every quantity of one configuration, from one set of formulas, as numbers or as sympy
expressions.

``quantities(model, train, parallel)`` is the single source of truth: a flat dict whose keys
are the dotted JSON paths (``"memory_bytes.peak"``) and whose values are the formulas over
the symbols in :mod:`costmodel.symbols.core`. Called inside ``symbols.numeric`` (what
``estimate``, ``sweep`` and the planner do: :func:`evaluated`) the formulas compute numbers,
Python ints and exact fractions or numpy arrays, and no expression is built; called
outside, they build the sympy expressions (:func:`expressions`, once per structure). The
formulas depend on the *structure* of the specs (kinds, flags, precision, kernels, which
parallel features are on) through Python branches; sizes and degrees enter as symbols.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from costmodel.frameworks.registry import framework_of
from costmodel.kinds import attention, ffn
from costmodel.parallel.distributed import sharded_memory
from costmodel.parallel.timing import step_time
from costmodel.single.finetune import adapter_params, trainable_params, tunes
from costmodel.single.flops import (
    backward_flops_by_op,
    flop_conventions,
    flop_totals,
    forward_flops_by_op,
)
from costmodel.single.memory import activation_memory, peak_memory, state_memory
from costmodel.single.params import active_params, non_embedding_params, param_breakdown
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import (
    ALL_SYMBOLS,
    BUDGET_SYMBOLS,
    HARDWARE_SYMBOLS,
    PARALLEL_SYMBOLS,
    N_cp,
    N_dp,
    N_pp,
    N_tok,
    X,
    Y,
    as_expr,
    numeric,
    price,
    symbolic,
)

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

MODEL_STRUCTURE = ("ffn", "norm", "bias", "qkv_bias", "qk_norm", "parallel_block", "tied", "pos",
                   "ffn_only", "shared_expert_gate", "moe_renormalize")  # fmt: skip
TRAIN_STRUCTURE = (
    "finetune",
    "lora_targets",
    "precision",
    "optimizer",
    "optimizer_impl",
    "attention",
    "elementwise",
    "recompute",
    "recompute_every",
    "dropout",
)
PARALLEL_STRUCTURE = (
    "zero", "sequence_parallel", "pipelined", "interleaved", "overlap", "framework", "async_tp",
    "grad_reduce_fp32", "reshard_after_forward", "ep_overlap", "pp_split_embedding",
    "pp_split_loss", "pp_schedule",
)  # fmt: skip
EVAL_SYMBOLS = ALL_SYMBOLS + PARALLEL_SYMBOLS + HARDWARE_SYMBOLS + BUDGET_SYMBOLS
BUDGET_KEYS = ("train_days", "train_cost")
MEMORY = (
    "memory_bytes_per_device.peak", "memory_bytes_per_device.reserved",
    "memory_bytes_per_device.params", "memory_bytes_per_device.master",
    "memory_bytes_per_device.grads", "memory_bytes_per_device.optimizer",
    "memory_bytes_per_device.buffers", "memory_bytes_per_device.activations",
    "memory_bytes_per_device.frozen",
)  # fmt: skip
TIMES = (
    "time_s.step", "time_s.forward", "time_s.backward", "time_s.bubble", "time_s.optimizer",
    "time_s.compute", "time_s.comm", "time_s.host_bound", "tokens_per_s", "mfu",
    "comm_time_s.dp", "comm_time_s.fsdp", "comm_time_s.tp", "comm_time_s.pp", "comm_time_s.cp",
    "comm_time_s.ep", "comm_exposed_share.tp", "comm_exposed_share.ep", "comm_overlapped_s.tp",
    "time_s.contention_forward", "time_s.contention_backward",
)  # fmt: skip
"""Device quantities of memory and time: what the planner evaluates per layout (NaN where a
structure has none; ``costmodel.engine.search.QUANTITIES``), and what a misspelt device
quantity asked without a device is matched against (``Estimate.missing``)."""

DEVICE_ROOTS = frozenset(("comm_bytes", "comm_exposed_share", "comm_overlapped_s",
                          "comm_phase_s", "comm_time_s", "hfu", "memory_bytes_per_device",
                          "mfu", "roofline", "tflops_per_device", "time_s", "tokens_per_s",
                          *BUDGET_KEYS))  # fmt: skip
"""The first parts of the keys only a layout on a device has (what :func:`quantities` adds
with a ``parallel``; ``tests/test_api.py`` holds the two equal)."""

# Sizes do not change the expressions, so structures are built from these placeholders.
_PLACEHOLDER_MODEL = {"vocab": 8, "d_model": 8, "n_layers": 1, "n_heads": 2, "d_ff": 8}


def _prefixed(prefix: str, parts: dict[str, sp.Expr]) -> dict[str, sp.Expr]:
    return {f"{prefix}.{k}": v for k, v in parts.items()}


def quantities(
    model: ModelSpec, train: TrainSpec, parallel: ParallelSpec | None = None
) -> dict[str, sp.Expr]:
    """Flat dict of dotted key -> expression for every reported quantity.

    With a ``parallel`` layout, adds per-device memory, communication, roofline step time
    and MFU (their expressions also use the parallel and hardware symbols).
    """
    out: dict[str, sp.Expr] = _prefixed("params", param_breakdown(model))
    out["params.non_embedding"] = non_embedding_params(model)
    if ffn.routes(model):  # what one token runs: all but the routed experts it is not sent to
        out["params.active"] = active_params(model)
    if tunes(train):
        out["params.adapters"] = adapter_params(model, train)
    out["params.trainable"] = trainable_params(model, train)
    out.update(_prefixed("flops", flop_totals(model, train)))
    out.update(_prefixed("flops.forward_by_op", forward_flops_by_op(model, train)))
    out.update(_prefixed("flops.backward_by_op", backward_flops_by_op(model, train)))
    out.update(_prefixed("flops.conventions", flop_conventions(model, train)))
    acts = activation_memory(model, train)
    mem = {**state_memory(model, train), "activations": acts.pop("total")}
    mem.update(peak_memory(model, train))
    out.update(_prefixed("memory_bytes", mem))
    out.update(_prefixed("memory_bytes.activations_by_op", acts))
    if parallel is not None:
        pricing = framework_of(parallel)
        out.update(_prefixed("memory_bytes_per_device",
                             sharded_memory(model, train, parallel, pricing=pricing)))  # fmt: skip
        out.update(step_time(model, train, parallel, pricing=pricing))
        out.update(training_cost(out["tokens_per_s"]))
    return {k: as_expr(v) for k, v in out.items()} if symbolic() else out


def training_cost(tokens_per_s: sp.Expr) -> dict[str, sp.Expr]:
    """Days to train on a token budget at this throughput, and their price over all devices
    (device-hours x price per device-hour)."""
    days = N_tok / tokens_per_s / 86400
    return {"train_days": days, "train_cost": days * 24 * N_dp * X * Y * N_pp * N_cp * price}


def structure_of(model: ModelSpec, train: TrainSpec, parallel: ParallelSpec | None = None) -> tuple:
    """The part of the specs that changes expressions (everything but the sizes): the
    model's kinds and flags, which matrices a block has, its layers' attention kinds
    (windowed or not, mixed or not: ``kinds.attention.structure``), the training's."""
    kinds = (getattr(model, f) for f in MODEL_STRUCTURE)
    blocks = (ffn.structure(model), attention.projections(model).name, model.q_lora_rank > 0)
    cores = attention.structure(model)
    base = (*kinds, blocks, cores, *(getattr(train, f) for f in TRAIN_STRUCTURE))
    if parallel is None:
        return (*base, None)
    return (*base, parallel_structure(parallel))


def parallel_structure(par: Any) -> tuple:
    """The layout features that change expressions (``PARALLEL_STRUCTURE``): ZeRO stage, SP,
    pipelining (pp > 1), interleaving (more than one virtual stage), the overlap rule, the
    framework, async TP, the reduce dtype, FSDP2's resharding after forward, combined
    1F1B's all-to-all overlap, the slots a pipeline split gives the embedding and loss, and
    the pipeline schedule."""
    return (par.zero, par.sequence_parallel, par.pp > 1, par.pp_interleave > 1, par.overlap,
            par.framework, par.async_tp, par.grad_reduce_fp32,
            par.reshard_after_forward, par.ep_overlap, par.pp_split_embedding,
            par.pp_split_loss, par.pp_schedule)  # fmt: skip


@dataclass(frozen=True)
class Expressions:
    """The expressions of one structure, key by key (what ``Estimate.expr`` shows)."""

    keys: tuple[str, ...]
    exprs: tuple[sp.Expr, ...]


@functools.lru_cache(maxsize=1024)
def specs_of(structure: tuple) -> tuple[ModelSpec, TrainSpec, ParallelSpec | None]:
    """Specs of a structure (:func:`structure_of`) with placeholder sizes: the formulas
    read sizes only through their symbols, so these give every quantity of the structure
    (as expressions, or as numbers inside ``symbols.numeric``)."""
    n_model = len(MODEL_STRUCTURE)
    m_kw = dict(zip(MODEL_STRUCTURE, structure[:n_model], strict=True))
    ffns, projections, q_lora = structure[n_model]
    m_kw.update(attention.placeholder(structure[n_model + 1]))
    t_kw = dict(zip(TRAIN_STRUCTURE, structure[n_model + 2 : -1], strict=True))
    sizes = dict(_PLACEHOLDER_MODEL, vocab=0) if m_kw["ffn_only"] else _PLACEHOLDER_MODEL
    sizes = {**sizes, **ffn.placeholder(ffns, m_kw)}
    sizes = {**sizes, **attention.projections_placeholder(projections, q_lora)}
    parallel = None
    if structure[-1] is not None:
        feats = dict(zip(PARALLEL_STRUCTURE, structure[-1], strict=True))
        pipelined, interleaved = feats.pop("pipelined"), feats.pop("interleaved")
        parallel = ParallelSpec(
            **feats, pp=2 if pipelined else 1, pp_interleave=2 if interleaved else 1
        )
    return ModelSpec(**sizes, **m_kw), TrainSpec(**t_kw), parallel


def evaluated(structure: tuple, values: dict[Any, Any]) -> dict[str, Any]:
    """Every quantity of a structure at ``values`` (symbol -> number or numpy array of
    one shape), computed by the formulas on the numbers: no expression is built."""
    with numeric(values):
        return quantities(*specs_of(structure))


@functools.lru_cache(maxsize=256)
def expressions(structure: tuple) -> Expressions:
    """Build the expressions of one structure (cached per process): only where a formula
    is asked for (``Estimate.expr``, the app's Formulas tab); numbers never build them."""
    exprs = quantities(*specs_of(structure))
    return Expressions(keys=tuple(exprs), exprs=tuple(exprs.values()))


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    root: dict[str, Any] = {}
    for key, value in flat.items():
        node = root
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return root


def flat(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (the inverse of :func:`nest`: a JSON answer
    read back by the dotted keys the Python answers use)."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
