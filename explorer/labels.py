"""What the sidebar calls each input: a plain label, with the schema's help text beside it.

Labels are words a newcomer reads (no ``capacity_factor`` or ``ep_overlap``); the help
is the input's own documentation (:data:`costmodel.inputs.INPUTS`), the text ``--help``
prints, so the two cannot drift apart.
"""

from __future__ import annotations

import re

from costmodel.inputs import BY_KEY

LABELS = {
    "model": "preset model",
    "d_model": "model width (d_model)",
    "n_layers": "layers",
    "n_heads": "attention heads",
    "n_kv_heads": "key/value heads",
    "d_ff": "feed-forward width (d_ff)",
    "vocab": "vocabulary size",
    "batch": "batch (sequences per step)",
    "seq": "sequence length",
    "precision": "precision",
    "optimizer": "optimizer",
    "optimizer_impl": "optimizer implementation",
    "attention": "attention",
    "attention_kernel": "flash kernel (auto: the device's default)",
    "elementwise": "elementwise kernels (fused: compiled; eager: PyTorch)",
    "fp8_recipe": "fp8 scaling (how fp8 GEMM operands are scaled)",
    "recompute": "recomputation",
    "grad_accum": "gradient accumulation steps (empty: from the micro-batch)",
    "microbatch": "micro-batch per device (empty: 1, or from the accumulation)",
    "finetune": "fine-tuning (full: every weight trains)",
    "lora_rank": "LoRA rank r",
    "lora_targets": "matrices with adapters",
    "hardware": "device",
    "gpus": "GPUs (empty: what the degrees need)",
    "framework": "framework (what each rank holds)",
    "fsdp": "FSDP / ZeRO shard group (empty: the framework's default)",
    "zero": "ZeRO stage",
    "tp": "tensor-parallel degree",
    "sequence_parallel": "sequence parallel (with tensor parallel)",
    "pp": "pipeline stages",
    "pp_interleave": "virtual stages per pipeline rank",
    "pp_schedule": "pipeline schedule (1F1B, or DeepSeek's DualPipe)",
    "cp": "context-parallel degree",
    "ep": "expert-parallel degree (mixture of experts)",
    "etp": "expert tensor-parallel degree (unset: tp)",
    "ep_dispatcher": "how tokens reach their experts (all-to-all, DeepEP, HybridEP)",
    "ep_imbalance": "expert load imbalance (busiest rank / mean)",
    "capacity_factor": "expert capacity (x the mean load; 0: no tokens dropped)",
    "ep_overlap": "hide expert all-to-alls behind compute (combined 1F1B)",
    "overlap": "overlap of communication",
    "grad_reduce_fp32": "reduce gradients in fp32",
    "token_budget": "token budget (tokens to train on)",
    "price_per_hour": "$ per device-hour",
}


OPS = {
    "attn_q": "Q projection", "attn_k": "K projection", "attn_v": "V projection",
    "attn_o": "attention output projection", "attn_scores": "attention scores (Q K^T)",
    "attn_values": "attention x V", "attn_core": "attention core", "ffn": "FFN",
    "experts": "routed experts", "shared_experts": "shared experts", "router": "router",
    "lm_head": "LM head",
}  # fmt: skip
"""The charts' names of the model's ops (``flops.*_by_op``, ``roofline.*``)."""


def op_name(op: str) -> str:
    """An op's name on a chart (the key with spaces where it is not listed)."""
    return OPS.get(op, op.replace("_", " "))


def label(key: str) -> str:
    """The plain label of input ``key`` (the key itself only for an input not listed)."""
    return LABELS.get(key, key.replace("_", " "))


def help_of(key: str) -> str:
    """The input's documentation as Markdown (the schema writes code as ``x``)."""
    return BY_KEY[key].help.replace("``", "`")


def in_words(message: str) -> str:
    """A message of the engine or the CLI as a page says it: ``--tp 4`` as ``tp 4`` and
    a field's snake_case name in words (``request_rate`` -> ``request rate``): the pages
    have widgets, not flags or field names."""
    message = re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", " "),
                     message)  # fmt: skip
    message = re.sub(r"(?<=[a-z0-9])=(?=[\w'\"-])", " ", message)  # batch=8 -> batch 8
    return re.sub(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b",
                  lambda m: m.group(1) if m.group(1) in KEPT else m.group(1).replace("_", " "),
                  message)  # fmt: skip


KEPT = frozenset({"expandable_segments", "max_num_seqs", "gpu_memory_utilization"})
"""Settings of other tools named as their users type them (PyTorch's allocator, vLLM's)."""
