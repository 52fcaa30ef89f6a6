"""FSDP2's per-device memory by position in the step: which units are gathered where.

FSDP2 (torch ``fully_shard``; torchtitan wraps the embedding, each block, and the final
norm with the output projection) gathers a unit's parameters into a flat all-gather
buffer, copies them out into the unsharded parameters and, in forward, keeps the flat
buffer until the next unit's copy-out (``AllGatherState``, to overlap that copy-out with
the next all-gather); in backward it prefetches the previous unit's all-gather while the
current one computes. Either way two units' worth of gathered weights are in flight
beside the computation: a block's inside the blocks, the head's at the loss. Backward
keeps the last unit's reduce-scatter input (its whole gradient in the reduce dtype;
``reduce_scatter_states``, one buffer by default) until the next unit reduces. Without
``reshard_after_forward`` every unit stays unsharded from its forward to its backward.
Source: torch 2.13 ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``
(``wait_for_unshard``, ``post_backward``, ``_backward_prefetch``); measured per rank by
``validate.distributed.memory`` (layouts ``fsdp2``, ``fsdp2-noreshard``). Bytes per device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from costmodel.frameworks.registry import Framework
from costmodel.kinds import ffn
from costmodel.parallel.experts import expert_block, expert_shards, local_experts
from costmodel.parallel.pipeline import PipelineRank
from costmodel.parallel.shares import shard_degree
from costmodel.parallel.state import shard_of
from costmodel.single.memory import HEAD_PARTS, SHARED_PARTS, activation_memory
from costmodel.single.params import block_params, param_breakdown
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import TRAITS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import D, L, N_cp, N_ep, T, V, X, Y, b, more_than_one, smax
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def unit_params(model: ModelSpec) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """Parameters of one FSDP2 unit before tensor parallelism: (embedding, one block with
    its two norms, head: the output projection and the final norm; a tied head uses the
    embedding's V x D matrix, gathered again). An MoE block holds its ep rank's
    n_experts / ep routed experts (torchtitan shards them over the dp_shard ranks its ep
    group leaves)."""
    block = block_params(model, norms=True, largest=True)
    block -= expert_block(model)[0] * (1 - 1 / N_ep)  # those the ep group's others hold
    if model.ffn_only:
        return integer(0), block, integer(0)
    parts = param_breakdown(model)
    embed = parts["embedding"] + parts["pos_embedding"]
    return embed, block, V * D + parts["norms"] / (2 * L + 1)


def _ungathered_experts(model: ModelSpec, train: TrainSpec) -> sp.Expr:
    """Routed-expert parameters of an MoE block FSDP2 holds no gathered copy of: torchtitan
    wraps a block's experts as a unit of their own over the shard ranks the ep group
    leaves; where that is one rank (ep takes the whole shard group) the unit computes with
    its shards, unless it casts them to the compute dtype (measured: 2 gloo ranks, fp32,
    ``validate.run --suite parallel``, layout ep-fsdp2)."""
    prec = PRECISIONS[train.precision]
    if prec.param != prec.activation:
        return integer(0)
    experts, _ = local_experts(model, [(ffn.top(model), integer(1))])  # 0 if none
    return experts * (1 - more_than_one(expert_shards(X * N_cp)))


def in_flight(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, sp.Expr]:
    """Gathered weight bytes per device at each position FSDP2's memory can peak.

    Forward: ``blocks`` (the end of the last block), ``transition`` (the head's
    all-gather, while the last block's flat buffer is still held) and ``head``; backward:
    ``head_backward``, ``backward_top`` (the top block computing) and ``backward_next``
    (the block below copying out); ``kept``: what stays gathered from forward to backward.
    With ``reshard_after_forward`` two units: a unit's unsharded parameters and a flat
    all-gather buffer (its own, or the next one's). Without: every unit gathered so far
    plus the flat buffer of the one gathering; backward gathers nothing and frees each
    unit after its backward. The flat buffers are freed at the end of forward."""
    c = PRECISIONS[train.precision].activation
    embed, block, head = (c * p / Y for p in unit_params(model))
    block -= c * _ungathered_experts(model, train)
    if par.reshard_after_forward:
        return {"blocks": 2 * block, "transition": block + head, "head": 2 * head,
                "head_backward": smax(2 * head, head + block), "backward_top": 2 * block,
                "backward_next": 2 * block, "kept": integer(0)}  # fmt: skip
    through = embed + L * block  # every unit before the head
    return {"blocks": through + block, "transition": through + block + head,
            "head": through + 2 * head, "head_backward": through + head,
            "backward_top": through, "backward_next": through - block,
            "kept": through + head}  # fmt: skip


def with_block_peaks(
    model: ModelSpec,
    train: TrainSpec,
    par: ParallelSpec,
    peaks: dict[str, sp.Expr],
    *,
    state: dict[str, sp.Expr],
    live: sp.Expr,
    acts_of: Callable[[tuple[str, ...] | None], sp.Expr],
    grad_shard: sp.Expr,
    residual: int,
) -> dict[str, sp.Expr]:
    """``peaks`` (the generic candidates, at the head) with the candidates inside the
    blocks, per micro-batch of b sequences of T tokens on this device. ``state``: the
    per-device components; ``live``: 1 when an earlier micro-batch left gradient shards,
    which later ones accumulate into; ``acts_of(ops)``: the saved bytes of those parts of
    ``activation_memory``; ``grad_shard``: gradient shard bytes per parameter.

    Forward at the end of the last block: the blocks' activations, the units in flight
    and the residual stream's two live copies; at the head's all-gather the final norm's
    input is saved too. Backward during the top block: every activation, the head's
    gradient shard and reduce-scatter input, and the gradients flowing back (the residual
    stream's and the FFN hidden state's). At the copy-out of the block below: one block's
    and the head's activations are freed, the top block's gradient waits in its
    reduce-scatter input (reduce dtype, the whole unit) and shard. The second step holds
    the optimizer state throughout.
    """
    prec = PRECISIONS[train.precision]
    gathered = in_flight(model, train, par)
    reduce = 4 if par.grad_reduce_fp32 else prec.activation
    _, block, head = (p / Y for p in unit_params(model))
    acts, head_acts = acts_of(None), acts_of(HEAD_PARTS)
    skip = (*HEAD_PARTS, *SHARED_PARTS, "total")
    block_acts = acts_of(tuple(op for op in activation_memory(model, train) if op not in skip)) / L
    mix = ffn.blocks(model)
    if len(mix) > 1:  # the top block (an MoE one): its own FFN's activations, not the average
        top_kind, top_blocks = mix[-1]
        skip = (*skip, *(part for kind, _ in mix for part in kind.kept_parts))
        rest = tuple(op for op in activation_memory(model, train) if op not in skip)
        block_acts = acts_of(rest) / L + acts_of(top_kind.kept_parts) / top_blocks
    earlier, fresh = live * state["grads"], (1 - live) * grad_shard  # shards held / made
    stream = residual * b * T * D
    stored = state["master"] + state["buffers"]
    blocks = stored + acts - head_acts + 2 * stream
    transition = blocks + acts_of(("final_norm",)) + gathered["transition"]
    forward = smax(blocks + gathered["blocks"], transition)
    hidden = prec.activation * b * T * ffn.top(model).hidden_width(model) / Y
    top = (stored + acts + earlier + gathered["backward_top"] + reduce * head
           + fresh * head + stream + hidden)  # fmt: skip
    below = (stored + acts - head_acts - block_acts + earlier + gathered["backward_next"]
             + reduce * block + fresh * (head + block) + stream)  # fmt: skip
    both = smax(forward + earlier, top, below)
    return {
        "peak_forward": smax(peaks["peak_forward"], forward),
        "peak_forward_backward": smax(peaks["peak_forward_backward"], both),
        "peak": smax(peaks["peak"], both + state["optimizer"]),
    }


class FSDP2(Framework):
    """FSDP2 (``fully_shard``) with a bf16 MixedPrecisionPolicy, as torchtitan applies it:
    fp32 sharded parameters, gradients and optimizer state over fsdp x cp, bf16 compute
    and residual, unsharded weights only for the units in flight."""

    traits = TRAITS["fsdp2"]

    def state(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
    ) -> dict[str, sp.Expr]:
        """fp32 master, gradients (reduce-scattered in fp32) and optimizer state over the
        shard group; ``params`` the most gathered weights in flight at once
        (:func:`in_flight`, in their own buffers beside the shards). Under pipelining
        torchtitan keeps the stage unsharded from its first micro-batch to its last
        (reshard_after_forward=False) and accumulates unsharded gradients in the reduce
        dtype until the last backward reduce-scatters them."""
        prec = PRECISIONS[train.precision]
        n, per_shard, opt = shard_of(model, train, par, rank)
        s = shard_degree(par)
        shards = {"master": prec.param * per_shard(s), "optimizer": opt(s)}
        if par.pp == 1:  # the most gathered at once, at the blocks or at the head
            unsharded = smax(*in_flight(model, train, par).values())
            return {"params": unsharded, **shards, "grads": prec.grad * per_shard(s)}
        held = self.accumulated_grad_bytes(train, par) * n
        return {"params": prec.activation * n, **shards, "grads": held + prec.grad * per_shard(s)}

    def accumulated_grad_bytes(self, train: TrainSpec, par: ParallelSpec) -> int:
        """Under pipelining with a weight copy, unsharded gradients in the reduce dtype."""
        prec = PRECISIONS[train.precision]
        if par.pp == 1 or not prec.weight_copy:
            return 0
        return 4 if par.grad_reduce_fp32 else prec.activation

    def gathered(self, model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict | None:
        """Without pipelining the peaks are modelled by position (:func:`in_flight`)."""
        return in_flight(model, train, par) if par.pp == 1 else None

    def block_peaks(self, model, train, par, peaks, **kw) -> dict[str, sp.Expr]:
        """The peaks inside the blocks (:func:`with_block_peaks`)."""
        return with_block_peaks(model, train, par, peaks, **kw)


FRAMEWORK = FSDP2()
