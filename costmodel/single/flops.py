"""Training FLOPs, as counted by ``torch.utils.flop_counter.FlopCounterMode``, and the
conventions people quote next to them.

Counting rules (FlopCounterMode, torch 2.x): only matmul-class ops count, 2 FLOPs per
multiply-add; an (m x k) @ (k x n) product costs 2·m·k·n; bias adds, norms, softmax and
elementwise ops count zero; attention's T x T products count dense even when causal. The
backward of a matmul is two matmuls (grad input and grad weight), so twice the forward. The
fused attention backward (``sdpa_backward_flop_count``) recomputes the scores: five T x T
matmuls against two in the forward, where the naive backward has four. Recomputed forward
ops run again inside backward and are counted there. A sliding window changes none of
these counts: torch counts SDPA with a mask densely, and the naive kernel computes every
score (``costmodel.kinds.attention``); ``useful`` counts only the unmasked pairs.
Fine-tuning (``costmodel.single.finetune``): the adapters are an op, ``lora``, of two
matmuls per adapted matrix (x A, then B); a frozen matmul's backward is its dX alone.
All quantities are FLOPs for one optimizer step over B sequences of T tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.kinds import attention, ffn
from costmodel.single.finetune import adapter_params, adapts, tunes
from costmodel.single.memory import checkpointed_share
from costmodel.single.params import (
    active_params,
    attention_matrices,
    ffn_matrices,
    head_widths,
    non_embedding_params,
    op_level_recomputed,
    param_breakdown,
)
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.algebra import shared
from costmodel.symbols.core import B, D, H, L, T, V, d_h, r_a
from costmodel.symbols.ops import add, expand, integer, ratio

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

BLOCK_OPS = ("attn_q", "attn_k", "attn_v", "attn_scores", "attn_values", "attn_o",
             *(op for kind in ffn.KINDS.values() for op in kind.ops))  # fmt: skip
CORE_OPS = ("attn_scores", "attn_values")


@shared
def forward_flops_by_op(model: ModelSpec, train: TrainSpec | None = None) -> dict[str, sp.Expr]:
    """Forward matmul FLOPs per op for B·T tokens (Kaplan et al. 2020, Table 1, per op);
    with a fine-tuning ``train``, its adapters' (2·r·(fan-in + fan-out) per token each)."""
    tokens = B * T
    ops: dict[str, sp.Expr] = {}
    if not model.ffn_only:
        for op, fan_in, fan_out in attention_matrices(model):
            ops[op] = ops.get(op, 0) + L * 2 * tokens * fan_in * fan_out
        o_proj = ops.pop("attn_o")
        # QK^T and PV per head: (T x d_qk)(d_qk x T) and (T x T)(T x d_v), counted dense.
        d_qk, d_val = head_widths(model, train.attention if train else "naive")
        ops["attn_scores"] = L * 2 * B * H * T * T * d_qk
        ops["attn_values"] = L * 2 * B * H * T * T * d_val
        ops["attn_o"] = o_proj
    for op, per_token in ffn.by_op(model, lambda kind: kind.forward_flops(model)).items():
        ops[op] = tokens * per_token
    if not model.ffn_only:
        ops["lm_head"] = 2 * tokens * D * V
    if train is not None and tunes(train):
        ops["lora"] = 2 * tokens * adapter_params(model, train)
    return ops


def recompute_flops_by_op(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """Forward FLOPs re-run inside backward, by op.

    ``full`` checkpoints every block, ``selective`` the attention core (Korthikanti et al.
    2022, Sec. 4.2). torch.utils.checkpoint (non-reentrant, early stop on by default) stops
    re-running a region once the last tensor it saved is rebuilt; a matmul saves its inputs
    before it runs, so the region's last matmul is skipped when only its inputs were saved:
    the FFN down-projection of a block, the PV product of naive attention. The fused kernel
    saves its own output, so it is re-run whole. With dropout on the residual branches its
    mask is the last tensor and nothing is skipped. ``selective-op`` (torchtitan's op-level
    policy) re-runs every second matmul but a block's last, and the naive core, whose
    batched matmuls it does not save; the fused kernel's outputs are saved.
    """
    fwd = forward_flops_by_op(model, train)
    skip_last = not train.dropout  # a branch dropout's mask comes after the last matmul
    if train.recompute == "selective-op":
        redo = op_level_recomputed(model, skip_last)
        ops = {op: share * fwd[op] for op, share in redo.items()}
        if train.attention == "naive" and not model.ffn_only:
            ops.update({k: fwd[k] for k in CORE_OPS})
        return ops
    if train.recompute == "full":  # an MoE block's last matmul output is weighted: saved
        ops = {k: v for k, v in fwd.items() if k in (*BLOCK_OPS, "lora")}
        if skip_last and adapts(model, train, "ffn", down=True):  # the down adapter's B
            ops["lora"] -= 2 * B * T * L * r_a * D
        elif skip_last:
            ops["ffn"] = fwd["ffn"] * ratio(ffn_matrices(model) - 1, ffn_matrices(model))
        share = checkpointed_share(train)  # every n-th block's only (recompute_every)
        return {k: share * v for k, v in ops.items()}
    if train.recompute == "selective" and not model.ffn_only:
        if train.attention == "naive":
            return {"attn_scores": fwd["attn_scores"]}
        return {k: fwd[k] for k in CORE_OPS}
    return {}


@shared
def backward_flops_by_op(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """Backward FLOPs per op, recomputation included (FlopCounterMode's convention)."""
    redo = recompute_flops_by_op(model, train)
    ops = {}
    for name, flops in forward_flops_by_op(model, train).items():
        ops[name] = backward_factor(name, train) * flops + redo.get(name, 0)
    return ops


def backward_factor(op: str, train: TrainSpec) -> sp.Expr:
    """Backward FLOPs (and time) over the forward's of an op: a matmul's backward is two
    matmuls of its size (dX and dW), a frozen one's dX alone (fine-tuning); the fused
    attention core's is 5/2 (FlashAttention-2 recomputes QKᵀ: five T x T matmuls for the
    forward's two; Dao 2023, Alg. 2), the naive core's 2."""
    if op in CORE_OPS or op == "attn_core":
        return ratio(5, 2) if train.attention == "flash" else integer(2)
    return integer(1) if tunes(train) and op != "lora" else integer(2)


def flop_conventions(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """The formulas quoted in papers, for B·T tokens, side by side with the exact count.

    - ``six_n``: 6·N·tokens, N all parameters (Hoffmann et al. 2022, Chinchilla, App. F);
      an MoE model's active ones, those a token runs (as MoE papers quote it).
    - ``six_n_non_embedding``: Kaplan et al. 2020, Sec. 2.1, C = 6·N with N non-embedding.
    - ``palm``: (6·N + 12·L·H·d_h·T)·tokens (Chowdhery et al. 2022, PaLM, App. B).
    - ``megatron``: 72·B·T·L·D²·(1 + T/(6D) + V/(12·L·D)), or 96·…·(1 + T/(6D) + V/(16·L·D))
      with full recomputation (Narayanan et al. 2021, Sec. 5.1, Eq. 3; assumes MHA, F = 4D).
    - ``useful``: the exact matmul count without recomputation, with the attention core
      scaled to the unmasked pairs of each layer's kind ("model FLOPs" for MFU): causal
      T·(T+1)/2 of T² scores, a sliding window's band (``costmodel.kinds.attention``); a
      frozen matrix's forward and dX only (fine-tuning).
    """
    tokens = B * T
    n_total = active_params(model)  # an MoE token runs its active parameters
    conv = {
        "six_n": 6 * n_total * tokens,
        "six_n_non_embedding": 6
        * (n_total - param_breakdown(model)["total"] + non_embedding_params(model))
        * tokens,
    }
    fwd = forward_flops_by_op(model, train)
    dense = sum((backward_factor(k, train) + 1) * v for k, v in fwd.items() if k not in CORE_OPS)
    conv["useful"] = dense
    if not model.ffn_only:
        conv["palm"] = (6 * n_total + 12 * L * H * d_h * T) * tokens
        if not ffn.routes(model):  # Narayanan et al.'s formula is for dense models
            conv["megatron"] = _megatron(train)
        # QKᵀ and PV, 2·d_h FLOPs per pair each, forward and a backward of twice that
        pairs = attention.total(model, lambda kind: kind.useful_pairs())
        conv["useful"] += expand(3 * 2 * 2 * B * H * d_h * pairs)  # integer coefficients
    return conv


def _megatron(train: TrainSpec) -> sp.Expr:
    share = checkpointed_share(train)
    if train.recompute == "full" and share == 1:
        return 96 * B * T * L * D**2 * (1 + T / (6 * D) + V / (16 * L * D))
    if train.recompute == "full":  # the recomputed forward, of the checkpointed blocks
        again = 24 * B * T * L * D**2 * (1 + T / (6 * D)) * share
        return again + 72 * B * T * L * D**2 * (1 + T / (6 * D) + V / (12 * L * D))
    return 72 * B * T * L * D**2 * (1 + T / (6 * D) + V / (12 * L * D))


def flop_totals(model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr]:
    """forward, backward and step (= forward + backward) FLOPs for one optimizer step."""
    fwd = add(*forward_flops_by_op(model, train).values())
    bwd = add(*backward_flops_by_op(model, train).values())
    redo = add(*recompute_flops_by_op(model, train).values())
    return {"forward": fwd, "backward": bwd, "step": fwd + bwd, "recompute": redo}
