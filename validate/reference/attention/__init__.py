"""Attention kernels: naive PyTorch, SDPA, compiled, tiled PyTorch and Triton FlashAttention-2.

Without CUDA, Triton kernels run in Triton's interpreter, which Triton decides when its
language module is first imported (by ``flash_triton`` or by ``torch.compile``). The switch
is set here, before any kernel module loads: ``TRITON_INTERPRET=1`` when CUDA is absent.
``flash_triton`` refuses clearly if Triton was loaded before it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from validate.reference.attention.flash_pytorch import FlashAttentionPytorch
from validate.reference.attention.naive import (
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
