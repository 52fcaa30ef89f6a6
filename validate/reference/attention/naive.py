"""Attention as PyTorch ops: the N x N scores and probabilities are materialised.

``naive_attention`` (eager, or ``torch.compile``d by ``compiled_naive_attention``) and
``sdpa_attention`` (torch's fused ``scaled_dot_product_attention``), all on
``(batch, seq, d)`` or ``(batch, heads, seq, d)`` tensors.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(Q Kᵀ / √d [+ causal mask]) V; keeps P (and the bool mask) for backward."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@functools.cache
def _compiled():
    return torch.compile(naive_attention, dynamic=False)


def compiled_naive_attention(q, k, v, is_causal: bool = False) -> torch.Tensor:
    """``naive_attention`` under ``torch.compile`` (inductor fuses the softmax chain).

    Each shape and dtype is its own graph (``dynamic=False``): the recompile limit is raised
    so that a sweep never falls back to eager past dynamo's default 8 graphs (on an H100
    the ninth shape of ``validate.run --suite attention`` ran eager before)."""
    with torch._dynamo.config.patch(recompile_limit=1024):
        return _compiled()(q, k, v, is_causal)


def sdpa_attention(q, k, v, is_causal: bool = False) -> torch.Tensor:
    """torch's ``scaled_dot_product_attention`` (flash / memory-efficient kernels)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def logsumexp_reference(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """L = logsumexp over keys of the scaled (masked) scores, in fp32: what flash saves."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.logsumexp(scores, dim=-1)
