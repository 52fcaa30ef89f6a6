"""What parameter-efficient fine-tuning (``TrainSpec.finetune``) is costed for, as rules of
plain values (scalars, or a sweep's arrays) that name the field they refuse."""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.specs import checks

LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "qv": ("attn_q", "attn_v"),
    "attention": ("attn_q", "attn_k", "attn_v", "attn_o"),
    "all-linear": ("attn_q", "attn_k", "attn_v", "attn_o", "ffn"),
}
"""The ops (``costmodel.single.params.block_matmuls``) each ``lora_targets`` adapts."""


def smallest_adapted_dim(model: Any, targets: str) -> Any:
    """The smallest fan-in or fan-out of the matrices ``targets`` adapts (a LoRA rank's
    bound; scalars or arrays)."""
    ops = LORA_TARGETS[targets]
    q = np.asarray(model.n_heads) * np.asarray(model.head_dim)
    dims = [np.asarray(model.d_model), q]
    if "attn_k" in ops:
        dims.append(np.asarray(model.n_kv_heads) * np.asarray(model.head_dim))
    if "ffn" in ops:
        dims.append(np.asarray(model.d_ff))
    return np.minimum.reduce(np.broadcast_arrays(*dims))


def finetune_rules(model: Any, train: Any) -> None:
    """What parameter-efficient fine-tuning is costed for: a language model with dense
    FFNs (adapters on experts are not modelled), a precision the adapters train in
    (not fp8), block-level or no recomputation (torchtitan's op-level policy counts the
    adapters' matmuls among a block's), and a rank within every adapted matrix (LoRA's
    r <= min(fan-in, fan-out), Hu et al. 2021, Sec. 4.1). Scalars or arrays of sizes."""
    kind = _one(train.finetune)  # a kind: one value per structure (sweeps group by it)
    if kind == "full":
        return
    for field, ok, why in (
        ("ffn_only", ~np.asarray(model.ffn_only, bool), "needs attention blocks and an embedding"),
        ("n_experts", np.asarray(model.n_experts) == 0,
         "is not modelled for a mixture-of-experts model (adapters on experts)"),
        ("kv_lora_rank", np.asarray(getattr(model, "kv_lora_rank", 0)) == 0,
         "is not modelled for MLA (adapters on its latent projections)"),
        ("precision", np.asarray(train.precision) != "fp8", "is not modelled with fp8 matmuls"),
        ("recompute", np.asarray(train.recompute) != "selective-op",
         "is not modelled with recompute=selective-op (use 'none', 'selective' or 'full')"),
    ):  # fmt: skip
        checks.require(ok, field, lambda why=why: f"finetune={kind} {why}")
    targets = _one(train.lora_targets)
    smallest = smallest_adapted_dim(model, targets)
    checks.at_most("lora_rank", train.lora_rank, "the smallest adapted matrix side", smallest,
                   f"(LoRA's rank is at most min(fan-in, fan-out) of the {targets} "
                   "matrices)")  # fmt: skip


def _one(value: Any) -> Any:
    """A kind's value from a spec (a plain value) or a sweep's group (an array of one)."""
    return np.asarray(value).flat[0].item() if isinstance(value, np.ndarray) else value
