"""Memory per device for one training step, in bytes.

Model state: parameters, gradients, optimizer state and, under mixed precision, the fp32
master weights (Rajbhandari et al. 2020, ZeRO, Sec. 3.1: 2Ψ + 2Ψ + 12Ψ for mixed Adam;
torch.autocast keeps fp32 parameters, which are the master copy, and caches a low-precision
copy of each matmul weight that backward keeps).

Activations: the bytes alive after the forward pass of one micro-batch of b sequences, by
the op that saves them. They follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation", Sec. 4.1, per-layer sbh(34 + 5as/h)) but count what the reference model in
``validate/reference/model.py`` really keeps, tensor by tensor, so
``validate/probes/accounting.py`` can check them exactly: norms keep their input and fp32
statistics; QKV and FFN inputs are kept once (shared storage); naive attention keeps Q, K,
V (expanded to H heads), the probabilities and the masks of its layers' kinds (a T x T bool
causal mask, a sliding window's band; ``costmodel.kinds.attention``); flash keeps Q, K, V, O
and an fp32 logsumexp (Dao 2023, FlashAttention-2, Alg. 1-2), and a local layer's additive
band mask; int64 token ids and targets;
the fp32 log-softmax of the logits. Recomputation: ``full`` keeps each block's input;
``selective-op`` (torchtitan's op-level policy) also the fused attention outputs and every
second matmul output (``costmodel.single.params.op_level_saved``). What the attention
projections and core keep is the projection kind's (``costmodel.kinds.attention``:
standard or MLA); an FFN's its kind's (``costmodel.kinds.ffn``); fine-tuning's frozen
weights and adapters adjust the parts (``costmodel.single.finetune``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds import attention, ffn
from costmodel.kinds.ops import INDEX_BYTES, norm_kept
from costmodel.single import finetune
from costmodel.single.params import matmul_weight_params, op_level_saved
from costmodel.single.precision import (
    OPTIMIZER_STATES,
    PRECISIONS,
    STAT_BYTES,
    optimizer_state_bytes,
)
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.algebra import shared
from costmodel.symbols.core import (
    B,
    D,
    F,
    H,
    K,
    L,
    L_rc,
    T,
    V,
    b,
    d_h,
    more_than_one,
    smax,
    smin,
)
from costmodel.symbols.ops import add, integer, is_zero

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def kept_weight_copies(
    model: ModelSpec, train: TrainSpec, matmul: Any = None, head: Any = None
) -> sp.Expr:
    """Matmul weights whose low-precision cast stays alive from forward to backward.

    Casts made inside a fully recomputed block are dropped and made again in backward, so
    only the LM head's cast is kept then (also under op-level selective recomputation,
    whose policy does not save casts). ``matmul`` and ``head`` default to the whole
    model's matmul weights and LM head; a device of a layout passes its own share.
    """
    if finetune.tunes(train):  # the adapters' casts; frozen weights are stored cast
        casts = finetune.adapter_params(model, train)
        return integer(0) if checkpoints_blocks(train) else casts
    matmul = matmul_weight_params(model) if matmul is None else matmul
    if not checkpoints_blocks(train):
        return matmul
    if model.ffn_only:
        return integer(0)
    head = V * D if head is None else head
    return head + uncheckpointed_share(train) * (matmul - head)  # blocks not checkpointed


def checkpoints_blocks(train: TrainSpec) -> bool:
    """Whether blocks run inside torch.utils.checkpoint (full or op-level selective)."""
    return train.recompute in ("full", "selective-op")


def _every_nth(train: TrainSpec) -> bool:
    """Full recomputation of every n-th block only (``recompute_every`` > 1)."""
    return train.recompute == "full" and getattr(train, "recompute_every", 1) != 1


def checkpointed_share(train: TrainSpec) -> sp.Expr:
    """The share of the blocks a checkpointing policy re-runs: all of them, but
    ceil(L / n) / L under full recomputation of every n-th block (``recompute_every``)."""
    return L_rc / L if _every_nth(train) else integer(1)


def uncheckpointed_share(train: TrainSpec) -> sp.Expr:
    """1 - :func:`checkpointed_share`, as (L - L_rc) / L: a quantity of the L blocks times
    it cancels L and stays an exact count."""
    return (L - L_rc) / L if _every_nth(train) else integer(0)


def state_memory(
    model: ModelSpec,
    train: TrainSpec,
    *,
    params: Any = None,
    kept_copies: Any = None,
    shards: tuple[Any, Any, Any] = (1, 1, 1),
) -> dict[str, sp.Expr]:
    """Bytes of params (working weights), master, grads and optimizer state.

    ``params`` and ``kept_copies`` default to the whole model's (the adapters' when
    fine-tuning, whose frozen weights are ``frozen``: ``costmodel.single.finetune``);
    ``shards`` divides (parameters and master, gradients, optimizer state), as ZeRO-3, -2
    and -1 do (Rajbhandari et al. 2020, Sec. 5).
    """
    prec = PRECISIONS[train.precision]
    n = finetune.trainable_params(model, train) if params is None else params
    kept = kept_weight_copies(model, train) if kept_copies is None else kept_copies
    p_shards, g_shards, o_shards = shards
    if prec.weight_copy:
        weights, master = prec.weight_copy * kept / p_shards, prec.param * n / p_shards
    else:
        weights, master = prec.param * n / p_shards, integer(0)
    return {
        "params": weights,
        "master": master,
        "grads": prec.grad * n / g_shards,
        "optimizer": optimizer_state_bytes(train.optimizer, train.precision, n) / o_shards,
        "frozen": finetune.frozen_bytes(model, train) / p_shards,
    }


def _norm_saved(model: ModelSpec, residual_bytes: int) -> sp.Expr:
    """Norm input plus fp32 rstd (and mean for LayerNorm), as fused kernels keep them."""
    return b * T * norm_kept(model.norm, residual_bytes, D)


SHARED_PARTS = ("inputs", "embedding", "rope", "attn_mask")
"""Parts of :func:`activation_memory` that belong to no block: token ids, position
tables and the mask, shared by all layers."""
HEAD_PARTS = ("final_norm", "lm_head_input", "loss")
"""Parts of :func:`activation_memory` written after the last block (once per stage
holding the head, whatever the micro-batches in flight)."""


@shared
def activation_memory(
    model: ModelSpec, train: TrainSpec, *, residual: int | None = None
) -> dict[str, sp.Expr]:
    """Bytes alive after the forward pass of one micro-batch, by the op that keeps them.
    ``residual`` overrides the precision's residual-stream bytes (a framework that runs
    the whole model in bf16 keeps a bf16 residual stream, where torch.autocast keeps fp32)."""
    prec = PRECISIONS[train.precision]
    act, mm = prec.activation, prec.matmul_input
    res = finetune.residual(train) if residual is None else residual
    parts: dict[str, sp.Expr] = {}
    if model.ffn_only:
        parts["inputs"] = res * b * T * D
    else:
        parts["inputs"] = 2 * INDEX_BYTES * b * T
        if model.pos == "learned":
            parts["embedding"] = INDEX_BYTES * T
        else:
            rope = attention.projections(model).rope_width(model)  # cos and sin tables,
            parts["rope"] = 2 * act * T * rope  # shared by all layers
        mask = attention.mask_bytes(model, train.attention, act)  # shared by all layers
        if not is_zero(mask):
            parts["attn_mask"] = mask
    if checkpoints_blocks(train):
        share = checkpointed_share(train)
        inputs_kept = L - 1 if model.ffn_only else L
        parts["block_inputs"] = share * inputs_kept * res * b * T * D
        if train.recompute == "selective-op":
            parts.update(_op_level_saved(model, train, act))
        if _every_nth(train):  # the blocks not checkpointed keep what they keep without it
            kept = _block_activations(model, train, act, res, mm)
            parts.update({k: uncheckpointed_share(train) * e for k, e in kept.items()})
    else:
        parts.update(_block_activations(model, train, act, res, mm))
    if not model.ffn_only:
        parts["final_norm"] = _norm_saved(model, res)
        parts["lm_head_input"] = mm * b * T * D
        parts["loss"] = 4 * b * T * V + 4  # fp32 log-softmax and the scalar total weight
    finetune.adjust_activations(model, train, parts)
    parts["total"] = add(*parts.values())
    return parts


def _block_activations(
    model: ModelSpec, train: TrainSpec, act: int, res: int, mm: int
) -> dict[str, sp.Expr]:
    parts: dict[str, sp.Expr] = {}
    if not model.ffn_only:
        parts["attn_norm"] = L * _norm_saved(model, res)
        parts["attn_input"] = L * mm * b * T * D
        if model.qk_norm:  # the Q and K projections' outputs and their rows' statistics
            parts["qk_norm"] = L * b * T * (H + K) * norm_kept(model.norm, act, d_h)
        parts.update(attention.projections(model).kept(model, train, act, mm))
        if not model.parallel_block:  # a parallel block's FFN reads attention's normed input
            parts["ffn_norm"] = L * _norm_saved(model, res)
    if not model.parallel_block:
        # An FFN-only stack without a cast feeds block 0 the input tensor itself, counted there.
        first_is_input = model.ffn_only and act == res
        parts["ffn_input"] = (L - 1 if first_is_input else L) * mm * b * T * D
    parts.update(ffn.by_op(model, lambda kind: _per_token_kept(kind, model, act, mm)))
    if train.dropout:  # a bool mask per residual branch
        parts["dropout_masks"] = (1 if model.ffn_only else 2) * L * b * T * D
    return parts


def _per_token_kept(kind: ffn.FFNKind, model: ModelSpec, act: int, mm: int) -> dict:
    """One block's FFN parts of :func:`activation_memory` for b·T tokens."""
    return {part: b * T * per_token for part, per_token in kind.kept(model, act, mm).items()}


def _op_level_saved(model: ModelSpec, train: TrainSpec, act: int) -> dict[str, sp.Expr]:
    """What op-level selective AC keeps per block besides its input: the fused attention
    kernel's O and logsumexp, and the outputs of every second matmul, split into those
    tensor parallelism shards and the row-parallel D-wide partial sums it does not."""
    saved = op_level_saved(model)
    parts = {}
    for key, rows in (("matmul_outputs", False), ("row_outputs", True)):
        widths = [w for _, w, row in saved if row == rows]
        if widths:
            parts[key] = L * act * b * T * add(*widths)
    if train.attention == "flash" and not model.ffn_only:
        parts["attention"] = L * (act * b * T * H * d_h + STAT_BYTES * b * H * T)
    return parts


def peak_memory(
    model: ModelSpec,
    train: TrainSpec,
    state: dict[str, sp.Expr] | None = None,
    acts: sp.Expr | None = None,
    *,
    residual: int | None = None,
    split: Any = 1,
    params_persist: bool | None = None,
    grads_live: sp.Expr | None = None,
    backward_params: sp.Expr | None = None,
    head: bool = True,
    backward_transient: Any = 0,
    casts: bool = True,
) -> dict[str, sp.Expr]:
    """Peak bytes for a forward pass, a forward + backward, and a whole training step.

    Estimates of the live set at the worst moment, not exact counts (allocator rounding and
    the order of frees are not modelled). Forward: every weight, the activations, and the
    transient of the reference model there (:func:`transient_bytes`). Backward has two candidate
    peaks: its start, when every activation is alive next to two fp32 logit gradients; and
    its end, when every gradient exists and the low-precision weight casts are gone. A
    training step's forward is one more candidate, so a step never peaks below its forward.
    Gradients also live through a micro-batch's forward and backward start when an earlier
    micro-batch left them (``grads_live``: by default min(B/b - 1, 1), 1 from the second
    micro-batch of gradient accumulation on). Step: the optimizer state is held throughout,
    plus one state-sized temporary inside foreach Adam (torch.optim._multi_tensor_adam) and
    an optional ``step_grads`` entry of ``state``, gradients made for the step alone
    (Megatron's fp32 copy of a bf16 buffer's shard); gradients are freed between steps
    (``zero_grad(set_to_none=True)``). Korthikanti et al.
    2022 count only what is saved.
    ``state`` and ``acts`` replace the single-device ones (per-device sharded values; an
    optional ``buffers`` entry is held throughout, as DDP's gradient buckets are);
    ``residual`` the residual-stream bytes; ``split`` divides what tensor parallelism
    shards: logits and their gradients (vocab-parallel loss), weights and their gradients;
    ``params_persist`` says whether ``state["params"]`` lives across steps (stored bf16
    weights, as Megatron and DeepSpeed keep) or only from forward to the end of backward
    (autocast's casts, FSDP's gathered layers); by default the latter under mixed precision.
    ``backward_params`` replaces the working weights beside backward's start where they
    differ from the forward's (FSDP2 gathers the head again, without the forward's flat
    buffer). ``backward_transient``: a layout's own transient in backward beside the
    activations (ring attention's buffers under context parallelism), a candidate beside
    backward's start. ``head``: whether this device runs the head and loss (a pipeline stage
    before the last does not: its transients are the blocks'). ``casts``: whether the
    working weights are autocast's casts of fp32 parameters (the reference model,
    DeepSpeed), whose recomputed block keeps its casts; False where a framework gathers
    them in the compute dtype and counts them by position (FSDP2's units in flight).
    """
    prec = PRECISIONS[train.precision]
    res = finetune.residual(train) if residual is None else residual
    state = state_memory(model, train) if state is None else state
    acts = activation_memory(model, train)["total"] if acts is None else acts
    persist = not prec.weight_copy if params_persist is None else params_persist
    if persist:
        stored, copies = state["params"] + state["master"], integer(0)
    else:  # fp32 parameters are the master; the casts are the working copy
        stored, copies = state["master"], state["params"]
    # communication buffers and frozen weights (fine-tuning) kept across steps
    stored += state.get("buffers", 0) + state.get("frozen", 0)
    fwd, start, end = transient_bytes(model, train, res, split, head=head, casts=casts)
    live = smin(B / b - 1, 1) if grads_live is None else grads_live
    earlier = live * state["grads"]  # an earlier micro-batch's gradients
    # the forward's transient and backward start's, beside the same live set
    again = copies if backward_params is None else backward_params
    at_start = smax(copies + fwd, again + start, again + backward_transient)
    fwd_bwd = stored + smax(acts + earlier + at_start, state["grads"] + end)
    temp = optimizer_temp(train, state["optimizer"]) + state.get("step_grads", 0)
    step = smax(
        fwd_bwd + state["optimizer"],
        stored + state["grads"] + state["optimizer"] + temp,
    )
    return {
        "peak_forward": stored + copies + acts + fwd,
        "peak_forward_backward": fwd_bwd,
        "peak": step,
    }


def optimizer_temp(train: TrainSpec, optimizer_bytes: Any) -> Any:
    """Bytes of the optimizer step's temporary: foreach Adam materialises sqrt(v) for every
    parameter it updates at once (torch.optim._multi_tensor_adam), one state's worth of
    what this device holds (its shard under ZeRO); fused Adam and SGD need none."""
    states = OPTIMIZER_STATES[train.optimizer]
    foreach_adam = states == 2 and train.optimizer_impl == "foreach"
    return optimizer_bytes / states if foreach_adam else 0


def transient_bytes(
    model: ModelSpec,
    train: TrainSpec,
    res: int,
    split: Any,
    *,
    head: bool = True,
    casts: bool = True,
) -> tuple:
    """Bytes alive beside the activations (forward, backward start, backward end).

    Forward: the residual stream's two live copies, the logits and their fp32 copy (plus
    the shifted logits of a vocabulary-parallel loss), or the naive scores before and
    after masking. Backward start: the fp32 gradients of the NLL
    loss and of the log-softmax (the low-precision cast comes after one is freed). End: with
    tied embeddings the head's gradient waits in autograd's input buffer until the
    embedding's arrives, and the two are summed (two extra V x D tensors). Without the
    ``head`` (a pipeline stage before the last) backward starts at the top block's FFN:
    the incoming gradient, the hidden's gradient and a fresh weight gradient. Fine-tuning
    (``costmodel.single.finetune``) has no weight gradients but the adapters' (negligible).
    """
    prec = PRECISIONS[train.precision]
    act, tuned = prec.activation, finetune.tunes(train)
    Vs, Fs = V / split, F / split
    fwd_transient = 2 * res * b * T * D
    start_transient = 2 * res * b * T * D
    end_transient = 2 * res * b * T * D
    if not model.ffn_only:
        if head:
            fwd_transient += (act + (4 if act != 4 else 0)) * b * T * Vs
            # a vocabulary-parallel cross-entropy (split > 1) subtracts the all-reduced max
            # into a new fp32 tensor before its exp (torch's loss_parallel; Megatron's
            # _VocabParallelCrossEntropy), where one device's fused log-softmax needs none
            if split != 1:
                fwd_transient += more_than_one(split) * 4 * b * T * Vs
            start_transient += 8 * b * T * Vs
            if model.tied and not tuned:
                end_transient += 2 * prec.grad * Vs * D
        else:  # the top block's FFN backward: the hidden's gradient and a fresh weight
            # gradient (its low-precision one and the fp32 cast under mixed precision)
            # beside the incoming gradient, before it is added into .grad
            weight_grad = (prec.grad + prec.weight_copy) * D * Fs
            start_transient += act * b * T * Fs + weight_grad - res * b * T * D
        if train.attention == "naive":
            fwd_transient = smax(fwd_transient, 2 * act * b * H * T * T)
            start_transient = smax(start_transient, 2 * act * b * H * T * T)
    else:
        fwd_transient += act * b * T * Fs
        start_transient += 2 * act * b * T * Fs
    if tuned:  # the embedding output's gradient (it requires one), the matrix QLoRA
        # dequantizes for the first block's dX; a frozen weight has no gradient
        end_transient += res * b * T * D + finetune.dequantized(model, train, split)
    elif prec.weight_copy:
        # A weight's low-precision gradient lives until its cast into the fp32 .grad: the
        # head's at the start of backward, a block matrix's at its end. Under full
        # recomputation a matmul's cast is freed after it in forward (nothing is saved): one
        # at a time beside the forward's live set. A recomputed block's casts, kept through
        # its backward, are no more than the casts none keeps for the same block then: the
        # end of backward peaks alike (measured on the meta device: gemma-2-2b, 2 blocks,
        # batch 8 x 128, bf16-mixed: 10,683,000,840 bytes under none and full).
        if not model.ffn_only and head:
            start_transient += prec.weight_copy * Vs * D
        end_transient += prec.weight_copy * D * Fs
        if checkpoints_blocks(train) and casts:
            fwd_transient += prec.weight_copy * D * Fs
    return fwd_transient, start_transient, end_transient
