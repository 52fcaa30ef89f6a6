"""FFN kinds: what one block's FFN holds, computes and keeps, by kind (``dense``, ``moe``),
and a model's mix of them (re-exports the registry)."""

from costmodel.kinds.ffn.registry import (
    KINDS,
    FFNKind,
    Gemm,
    blocks,
    by_op,
    grouped_ops,
    ops,
    placeholder,
    routes,
    structure,
    top,
    total,
)

__all__ = ["KINDS", "FFNKind", "Gemm", "blocks", "by_op", "grouped_ops", "ops", "placeholder",
           "routes", "structure", "top", "total"]  # fmt: skip
