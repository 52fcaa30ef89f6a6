"""Attention kinds: what one layer's core computes and keeps, by kind (``causal``,
``window``), and a model's mix of them (the registry); what surrounds the core, by
projection kind (``standard`` MHA/GQA/MQA, ``latent`` MLA: ``projections``)."""

from costmodel.kinds.attention.projections import PROJECTIONS, Projections, projections
from costmodel.kinds.attention.projections import placeholder as projections_placeholder
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
    "PROJECTIONS",
    "AttentionCore",
    "Projections",
    "layer_counts",
    "mask_bytes",
    "mask_kernels",
    "per_layer",
    "placeholder",
    "projections",
    "projections_placeholder",
    "structure",
    "total",
]
