"""Attention kernels: naive PyTorch, SDPA, compiled, tiled PyTorch and Triton FlashAttention-2."""

from validate.attention.flash_pytorch import FlashAttentionPytorch
from validate.attention.naive import (
    compiled_naive_attention,
    logsumexp_reference,
    naive_attention,
    sdpa_attention,
)

__all__ = [
    "FlashAttentionPytorch",
    "compiled_naive_attention",
    "logsumexp_reference",
    "naive_attention",
    "sdpa_attention",
]
