"""Kernels one micro-batch dispatches: what a per-op host cost multiplies.

Every op eager PyTorch runs costs host time (Python, the autograd record, the ATen
dispatcher, the allocator, the launch) whatever its size; when ops are small that host
time, not the device, sets the step time (He 2022, "Making Deep Learning Go Brrrr From
First Principles", overhead-bound regime). ``eager`` counts are those of the reference
model (``validate/reference/model.py``, its norms in ``validate/reference/norms.py``), op
by op as torch dispatches them, views excluded; ``validate.probes.dispatch`` counts the same
on the ``meta`` device and the tests check every count exactly. ``fused`` (torch.compile,
Megatron's and Transformer Engine's fused kernels) counts the matmuls, the attention core
and one kernel per fused elementwise region: each norm, RoPE, the FFN activation and the
residual adds (an estimate: compilers choose their regions). Units: kernels.
"""

from __future__ import annotations

from typing import Any

from costmodel.kinds import attention, ffn
from costmodel.kinds.ops import STAT
from costmodel.kinds.ops import differ as _differ
from costmodel.single.memory import checkpointed_share
from costmodel.single.params import block_matmuls, op_level_recomputed
from costmodel.single.precision import PRECISIONS, Precision
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.core import H, K, more_than_one, values_for

# per norm (forward, backward): RMSNorm pow, mean, +eps, rsqrt, two products; backward
# three products for x̂ and the weighted gradient, mean, product, subtract, ·rstd, and
# g·x̂ with its sum for dw. LayerNorm adds the mean and its two subtractions, the bias
# (forward) and the second mean, two subtractions and the bias sum (backward).
_NORM_OPS = {"rmsnorm": (6, 9), "layernorm": (10, 13)}
# rotate-half RoPE on Q and on K: x·cos, neg, cat, ·sin, add; backward two products, neg,
# cat of the halves' gradients and the add of the two paths
_ROPE_OPS = 10
# naive core: two batched matmuls, the contiguous copies of Q, Kᵀ, V and the
# probabilities they take, the scale, the mask fill, the softmax; backward four batched
# matmuls, the same copies, the softmax's and the mask's gradients, the scale
_NAIVE_CORE = (9, 11)


def counted(kernels: tuple[Any, Any], model: ModelSpec) -> tuple[int, int]:
    """(forward, backward) kernel counts of ``model`` from :func:`layer_kernels`' or
    :func:`model_kernels`' expressions (which hold the sizes they depend on as symbols, so
    that a structure built once counts every size)."""
    import sympy as sp

    values = values_for(model)
    return tuple(int(k.subs(values)) if isinstance(k, sp.Basic) else k for k in kernels)


def _norm_ops(model: ModelSpec, prec: Precision, residual: int) -> tuple[int, int]:
    """(forward, backward) of one norm: its ops, the casts of its input, output and (in
    backward) gradients to fp32 statistics and back, and of its weights (and bias)."""
    fwd, bwd = _NORM_OPS[model.norm]
    # weight (and bias) widened in forward; in backward the weight again and the casts of
    # dw (and db) back to the parameter dtype
    weights = {"rmsnorm": (1, 2), "layernorm": (2, 3)}[model.norm]
    fwd += 2 * _differ(residual, STAT) + weights[0] * _differ(prec.param, STAT)
    bwd += 3 * _differ(residual, STAT) + weights[1] * _differ(prec.param, STAT)
    return fwd, bwd


def _core(model: ModelSpec, train: TrainSpec) -> tuple[int, int]:
    """(forward, backward) of the attention core (its dropout included); the naive core
    sums the gradients of K and V repeated for grouped heads."""
    if train.attention == "flash":
        return 1, 1
    drop = int(train.dropout > 0)
    grouped = 2 * more_than_one(H / K)  # grouped query heads: K and V repeated
    return _NAIVE_CORE[0] + drop, _NAIVE_CORE[1] + drop + grouped


def _projections(model: ModelSpec, prec: Precision) -> tuple[int, int]:
    """(forward, backward) of attention's Q, K, V and O matmuls: as an FFN's, and the sums of
    the gradients of the input Q, K and V share."""
    biased = 4 if model.bias else 3 if model.qkv_bias else 0
    casts = (4 + biased) * _differ(prec.param, prec.activation)
    return 4 + casts, 8 + biased + casts + 2


def layer_kernels(
    model: ModelSpec, train: TrainSpec, residual: int, *, block: str = "dense"
) -> tuple[int, int]:
    """(forward, backward) kernels of one block per micro-batch, recomputation included;
    ``residual``: bytes per element of the residual stream (the framework's); ``block``:
    the kind of the block's FFN (``costmodel.kinds.ffn``: its kernels are the kind's)."""
    kind = ffn.KINDS[block]
    if train.elementwise == "fused":
        return _fused_layer(model, train, kind)
    projections = attention.projections(model)
    if not projections.eager:  # refused by the spec layer: never a silent number
        raise ValueError(f"eager kernel counts are not modelled for {projections.title}")
    prec = PRECISIONS[train.precision]
    a = prec.activation
    mm = len(block_matmuls(model))
    branches = 1 if model.ffn_only else 2
    drop = branches * int(train.dropout > 0)
    mlp = kind.eager_kernels(model, prec)
    fwd = mlp[0] + branches + drop
    bwd = mlp[1] + drop + branches * (1 + _differ(residual, a))  # stream paths, branch cast
    inputs = branches * _differ(residual, a)  # block inputs cast to the compute dtype
    fwd, bwd = fwd + inputs, bwd + inputs
    if not model.ffn_only:
        proj = _projections(model, prec)
        norm = _norm_ops(model, prec, residual)
        core = _core(model, train)
        rope = _ROPE_OPS if model.pos == "rope" else 0
        fwd += proj[0] + 2 * norm[0] + rope + core[0]
        bwd += proj[1] + 2 * norm[1] + rope + core[1]
        if model.qk_norm:  # over the Q and K projections' outputs, in the compute dtype
            qk = _norm_ops(model, prec, a)
            fwd, bwd = fwd + 2 * qk[0], bwd + 2 * qk[1]
    return fwd, bwd + _recomputed(model, train, fwd, mm)


def _recomputed(model: ModelSpec, train: TrainSpec, fwd: int, mm: int) -> int:
    """Kernels backward runs again: the whole block but what torch.utils.checkpoint's early
    stop skips (the last matmul and residual add; only the add after a dropout, whose mask
    backward needs), the core alone (selective; the naive core but its last batched matmul
    and the copy it takes), or all but the saved matmuls and the core (op-level selective
    AC, ``costmodel.single.params.op_level_recomputed``)."""
    skipped = 1 if train.dropout else 2
    if train.recompute == "full":  # of the checkpointed blocks (recompute_every)
        return checkpointed_share(train) * (fwd - skipped)
    if train.recompute == "selective":
        if model.ffn_only:
            return 0
        return 1 if train.attention == "flash" else _core(model, train)[0] - 2
    if train.recompute == "selective-op":  # the last add never; matmuls as the policy says
        order = [op for op, _, _ in block_matmuls(model)]
        redo = op_level_recomputed(model, skip_last=not train.dropout)
        again = int(sum(share * order.count(op) for op, share in redo.items()))
        saved_core = 0 if model.ffn_only or train.attention == "naive" else 1
        return fwd - 1 - mm + again - saved_core
    return 0


def _fused_layer(model: ModelSpec, train: TrainSpec, kind: ffn.FFNKind) -> tuple[int, int]:
    """(forward, backward) kernels of a block with fused elementwise regions: its matmuls
    (an MoE FFN's grouped GEMMs one per expert matrix, as Megatron's GroupedMLP and
    torchtitan's grouped_mm run them), one kernel per fused region, the attention core,
    and what the FFN kind adds (``FFNKind.fused_kernels``)."""
    mm = len(block_matmuls(model))
    regions = 2 if model.ffn_only else 2 + 2 + (1 if model.pos == "rope" else 0)
    regions += 2 if model.qk_norm else 0
    regions += len(attention.projections(model).norm_widths(model))  # e.g. MLA's latents'
    fwd = mm + regions + (0 if model.ffn_only else 1)
    bwd = 2 * mm + regions + (0 if model.ffn_only else 1)
    extra = kind.fused_kernels(model)
    fwd, bwd = fwd + extra[0], bwd + extra[1]
    full = checkpointed_share(train) * (fwd - 2)
    again = {"full": full, "selective": 0 if model.ffn_only else 1}.get(train.recompute, 0)
    if train.recompute == "selective-op":
        again = fwd - 2 - mm // 2
    return fwd, bwd + again


def graphed_kernels(model: ModelSpec, train: TrainSpec, *, block: str = "dense") -> tuple:
    """(forward, backward) kernel launches of one block that partial CUDA graphs save the
    host (``ParallelSpec.cuda_graphs`` ``partial``: Megatron-Core's Transformer Engine graphs
    of ``attn``, ``moe_router`` and ``moe_preprocess``): the kernels they capture less the
    one launch each graph costs. The attention's: its matmuls, its norm, RoPE (and the Q/K
    norms, the latents' norms), the core and the residual add; the FFN kind's
    (``FFNKind.graphed_kernels``); the recomputed forward's again under full recomputation.
    Counted with fused elementwise regions (the frameworks that capture graphs fuse them);
    none with eager elementwise."""
    if train.elementwise != "fused":
        return 0, 0
    kind = ffn.KINDS[block]
    extra_fwd, extra_bwd, graphs = kind.graphed_kernels(model)
    fwd, bwd = extra_fwd, extra_bwd
    if not model.ffn_only:
        attn = sum(1 for op, _, _ in block_matmuls(model) if op.startswith("attn"))
        regions = 2 + (1 if model.pos == "rope" else 0) + (2 if model.qk_norm else 0)
        regions += len(attention.projections(model).norm_widths(model))
        fwd, bwd = fwd + attn + regions + 1, bwd + 2 * attn + regions + 1
        graphs += 1
    again = checkpointed_share(train) if train.recompute == "full" else 0
    return fwd - graphs, bwd - graphs + again * (fwd - graphs)


def model_kernels(model: ModelSpec, train: TrainSpec, residual: int) -> tuple[int, int]:
    """(forward, backward) kernels outside the blocks per micro-batch: the embedding (and
    learned positions), the RoPE tables and the attention masks of the layers' kinds
    (``costmodel.kinds.attention``), the final norm, the head, and the loss (fp32 cast,
    log-softmax, NLL; backward their gradients)."""
    prec = PRECISIONS[train.precision]
    a = prec.activation
    if model.ffn_only:  # the output cast to fp32 and summed
        return 1 + _differ(residual, STAT), 1 + _differ(residual, STAT)
    if train.elementwise == "fused":
        return 5, 6
    norm = _norm_ops(model, prec, residual)
    # lookup, final norm, head matmul(s) and weight cast, log-softmax and NLL (backward: the
    # seed, their two gradients), the norm output's and the logits' casts
    fwd = 1 + norm[0] + 1 + _differ(prec.param, a) + 2 + _differ(residual, a) + _differ(a, STAT)
    bwd = 1 + norm[1] + 2 + _differ(prec.param, a) + 3 + _differ(residual, a) + _differ(a, STAT)
    if model.pos == "rope":  # arange x2, exponent, power, reciprocal, outer, cat, cos, sin
        fwd += 10 + 2 * _differ(a, STAT)
    else:  # positions: arange, lookup, add; backward the lookup's and the broadcast sum
        fwd, bwd = fwd + 3, bwd + 2
    fwd += attention.mask_kernels(model, train.attention)  # e.g. naive causal: ones, triu
    if model.tied:
        bwd += 1  # the shared table's two gradients added
    return fwd, bwd
