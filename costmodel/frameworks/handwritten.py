"""The hand-written ZeRO-3 of ``validate/fsdp.py``: per-device memory and communication.

What it does (Rajbhandari et al. 2020, Sec. 5.3, written the way people write it to learn):
every parameter with two dimensions is split into a flat fp32 shard of
ceil(numel / fsdp) elements per device (zero-padded); one-dimensional parameters (norm
gains, biases) are replicated, their gradients all-reduced once per step. Each module
all-gathers its own matrices (cast to the compute dtype first) just before it runs and
drops them after, with no prefetch: one matrix is gathered at a time. Backward gathers a
matrix again where a forward op saved it (every projection and the head; an embedding's
backward needs only the indices), and reduce-scatters each weight gradient in fp32.

Memory is modelled at the positions where it peaks, read op by op from a per-rank trace
(``validate.distributed.memory``, layout ``fsdp-by-hand``):

- forward, at the loss: the logits (compute dtype) and their fp32 copy beside the
  log-softmax output, or, while the head runs, its gathered weight beside the logits;
- backward, at the loss: the NLL and log-softmax gradients (8 bytes per logit), or, at
  the head's weight gradient, the head gathered again and its gradient beside the logit
  and input gradients, or the head's gradient being reduce-scattered (itself, a padded
  fp32 flat buffer and its fp32 cast); on a device with few tokens, the top block's down
  projection being reduce-scattered;
- backward's end: every gradient shard, and the embedding's gradient with its fp32 flat
  copy being reduce-scattered.

Which is the highest depends on tokens vs width (at Llama scale, the 8 bytes per logit).
Bytes per device; b and T are the device's micro-batch (``sharded_memory`` substitutes
them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.frameworks.registry import Framework
from costmodel.kinds import attention
from costmodel.parallel.activations import sharded_activations
from costmodel.parallel.collectives import bus_factor, ring_steps
from costmodel.parallel.pipeline import PipelineRank
from costmodel.single.memory import HEAD_PARTS, optimizer_temp
from costmodel.single.params import ffn_matrices, param_breakdown, weight_matrices
from costmodel.single.precision import PRECISIONS, optimizer_state_bytes
from costmodel.specs.frameworks import TRAITS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import W_X, D, F, L, P, T, V, X, a_X, b, m, smax
from costmodel.symbols.ops import integer, sceil

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

SHARD_BYTES = 4
"""The shards, their gradients and the reduce-scatter are fp32 whatever the precision."""


def padded(elements: sp.Expr) -> sp.Expr:
    """A matrix's elements after padding to a multiple of the fsdp degree."""
    return X * sceil(elements / X)


def _split(model: ModelSpec) -> tuple[sp.Expr, sp.Expr]:
    """(padded elements of every sharded matrix, elements of the replicated parameters)."""
    mats = weight_matrices(model)
    sharded = sum((n * padded(e) for n, e in mats), integer(0))
    replicated = param_breakdown(model)["total"] - sum((n * e for n, e in mats), integer(0))
    return sharded, replicated


def _largest(model: ModelSpec) -> sp.Expr:
    """Padded elements of the largest matrix: what is gathered at the worst moment."""
    return smax(*(padded(e) for _, e in weight_matrices(model)))


def _tables(model: ModelSpec) -> list[sp.Expr]:
    """Elements of the embedding tables (token, and learned positions): looked up, not
    multiplied, so backward does not gather them again."""
    if model.ffn_only:
        return []
    return [V * D, *([P * D] if model.pos == "learned" else [])]


def state(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """params (the most gathered at once), master (fp32 shards and replicated
    parameters), grads and optimizer state, bytes per device."""
    prec = PRECISIONS[train.precision]
    sharded, replicated = _split(model)
    shard = sharded / X
    return {
        "params": prec.activation * _largest(model),
        "master": SHARD_BYTES * shard + prec.param * replicated,
        "grads": SHARD_BYTES * shard + prec.grad * replicated,
        "optimizer": optimizer_state_bytes(train.optimizer, "fp32", shard)
        + optimizer_state_bytes(train.optimizer, train.precision, replicated),
    }


def peaks(
    model: ModelSpec,
    train: TrainSpec,
    state: dict[str, sp.Expr],
    acts: sp.Expr,
    head_acts: sp.Expr,
    live: sp.Expr,
    optimizer_temp: sp.Expr,
) -> dict[str, sp.Expr]:
    """peak_forward, peak_forward_backward and peak (module docstring), the last with the
    optimizer state held throughout as on every step after the first. ``acts``: the
    activations kept from forward to backward, ``head_acts`` those of the final norm, the
    head and the loss; ``live``: 1 when an earlier micro-batch left gradients;
    ``optimizer_temp``: the optimizer's transient (foreach Adam's sqrt of the second
    moments)."""
    c = PRECISIONS[train.precision].activation
    stored, grads = state["master"], state["grads"]
    earlier = live * grads
    up = SHARD_BYTES if c != SHARD_BYTES else 0  # an fp32 copy of a compute-dtype tensor

    def reduced(elements: sp.Expr) -> sp.Expr:
        """A weight gradient being reduce-scattered: itself, its zero-padded fp32 flat
        buffer and (under mixed precision) its fp32 cast."""
        return c * elements + (SHARD_BYTES + up) * padded(elements)

    # the top block's down projection reduce-scattered: the head's activations freed, the
    # residual stream's and the projection input's gradients flowing
    top = acts - head_acts + c * b * T * (D + F) + reduced(D * F)
    if model.ffn_only:
        forward = stored + earlier + acts + 2 * c * _largest(model)
        start, table = stored + earlier + top, D * F
    else:
        logits = b * T * V
        loss = SHARD_BYTES * logits + 4  # the log-softmax output and the total weight
        head = c * padded(V * D)
        forward = stored + earlier + acts + smax((c + up) * logits, head + c * logits - loss)
        at_head = smax(acts + 8 * logits,  # the NLL and log-softmax gradients
                       acts - loss + c * logits + head + c * V * D + c * b * T * D,
                       acts - loss + reduced(V * D), top)  # fmt: skip
        start = stored + earlier + at_head
        table = V * D  # the token embedding's gradient, reduced last
    end = stored + grads + reduced(table)
    both = smax(forward, start, end)
    return {
        "peak_forward": forward,
        "peak_forward_backward": both,
        "peak": smax(
            both + state["optimizer"], stored + grads + state["optimizer"] + optimizer_temp
        ),
    }


def gradient_traffic(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """HBM bytes per micro-batch of preparing the weight gradients for their fp32
    reduce-scatter: each is zero-filled into a padded fp32 buffer (write 4), cast to fp32
    under mixed precision (read c, write 4) and copied in (read 4, write 4); memory-bound
    work FSDP2 and Megatron do not do (they reduce in place)."""
    c = PRECISIONS[train.precision].activation
    per_element = SHARD_BYTES + (c + SHARD_BYTES if c != SHARD_BYTES else 0) + 2 * SHARD_BYTES
    return per_element * _split(model)[0]


def fsdp_group(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """Bytes one device sends per step over the fsdp group and their alpha-beta seconds
    (ring collectives, ``costmodel.parallel.collectives``), by phase: per micro-batch
    every matrix gathered in forward, every one but the embedding tables gathered again
    in backward, every weight gradient reduce-scattered in fp32; once per step the
    replicated parameters' gradients all-reduced. Nothing is prefetched, so none of it
    overlaps compute (``step_time`` exposes this group)."""
    prec = PRECISIONS[train.precision]
    c = prec.activation
    sharded, replicated = _split(model)
    count = sum((n for n, _ in weight_matrices(model)), integer(0))
    tables = _tables(model)
    gather, scatter = bus_factor("all_gather", X), bus_factor("reduce_scatter", X)
    fwd = m * gather * c * sharded
    unsaved = sum((padded(e) for e in tables), integer(0))
    bwd = m * (gather * c * (sharded - unsaved) + scatter * SHARD_BYTES * sharded)
    opt = bus_factor("all_reduce", X) * prec.grad * replicated
    steps = ring_steps("all_gather", X) * a_X
    return {
        "bytes": fwd + bwd + opt,
        "forward": fwd / W_X + m * count * steps,
        "backward": bwd / W_X + m * (2 * count - len(tables)) * steps,
        "optimizer": opt / W_X + replicated_tensors(model) * ring_steps("all_reduce", X) * a_X,
    }


def replicated_tensors(model: ModelSpec) -> sp.Expr:
    """One-dimensional parameters, each all-reduced on its own: norm gains (and LayerNorm
    biases; FFN-only stacks have no norms; QK-norm's two per block, MLA's latents') and
    every bias vector
    (over the L blocks as a symbol: one structure serves every depth)."""
    ffn = ffn_matrices(model) if model.bias else 0
    if model.ffn_only:
        return L * ffn
    per_norm = 1 if model.norm == "rmsnorm" else 2
    latents = len(attention.projections(model).norm_widths(model))  # MLA's
    per_block = 2 + (2 if model.qk_norm else 0) + latents
    norms = (per_block * L + 1) * per_norm  # MLA's latents' norms too
    qkv = 3 if model.bias or model.qkv_bias else 0
    out = 1 if model.bias else 0
    return norms + L * (ffn + qkv + out)


class Handwritten(Framework):
    """``validate/fsdp.py``: ZeRO-3 over fsdp alone, nothing prefetched or overlapped."""

    traits = TRAITS["handwritten"]

    def state(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
    ) -> dict[str, sp.Expr]:
        return state(model, train)

    def own_peaks(self, model, train, par, state, acts, live) -> dict[str, sp.Expr]:
        """The positions :func:`peaks` names, with the head's activations and the
        optimizer's transient."""
        head = sharded_activations(model, train, par, only=HEAD_PARTS)
        temp = optimizer_temp(train, state["optimizer"])
        return peaks(model, train, state, acts, head, live, temp)

    def fsdp_group(self, model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
        return fsdp_group(model, train)

    def backward_traffic(self, model: ModelSpec, train: TrainSpec) -> sp.Expr:
        return gradient_traffic(model, train)


FRAMEWORK = Handwritten()
