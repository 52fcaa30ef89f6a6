"""Attention-core kinds: what one layer's core computes and keeps, by kind
(``causal``, ``window``), and a model's mix of them (re-exports the registry)."""

from costmodel.kinds.attention.registry import (
    KINDS,
    AttentionCore,
    layer_counts,
    mask_bytes,
    mask_kernels,
    per_layer,
    placeholder,
    structure,
    total,
)

__all__ = [
    "KINDS",
    "AttentionCore",
    "layer_counts",
    "mask_bytes",
    "mask_kernels",
    "per_layer",
    "placeholder",
    "structure",
    "total",
]
