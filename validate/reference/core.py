"""The attention core's call and masks, shared by the reference model's attention kinds."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def attend(core: nn.Module, selective: bool, q, k, v, mask, out: nn.Module) -> torch.Tensor:
    """``core`` over (b, T, heads, width) q, k and v, checkpointed when ``selective``
    (Korthikanti et al. 2022, Sec. 4.2), then ``out`` over its heads side by side."""
    b, t = q.shape[:2]
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))
    if selective:
        rng = core.dropout > 0  # the recomputed mask must be the forward's
        o = checkpoint(core, q, k, v, mask, use_reentrant=False, preserve_rng_state=rng)
    else:
        o = core(q, k, v, mask)
    return out(o.transpose(1, 2).reshape(b, t, -1))


def attention_masks(
    kernel: str, local: list[bool], window: int, t: int, compute: torch.dtype, device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(global layers' mask, local layers' mask), built once per forward for the blocks
    whose flags are ``local`` and shared by all blocks of a kind (as
    ``costmodel.kinds.attention`` counts them). The naive kernel takes bool masks of the
    pairs it drops: the future (``ones``, ``triu``), and for a sliding window of ``window``
    keys also the keys j <= i - window (``ones``, ``triu``, ``tril``, ``or``; Mistral 7B,
    Jiang et al. 2023, Sec. 2). The fused kernel masks causally by itself; a local layer's
    takes the band as an additive mask in the compute dtype (``zeros``, ``masked_fill``):
    the CPU flash kernel accepts no other, and keeps it for backward."""
    causal = band = None
    if kernel == "naive" and not all(local):
        causal = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
    if any(local):
        ones = torch.ones(t, t, dtype=torch.bool, device=device)
        band = ones.triu(1) | ones.tril(-window)
        if kernel == "flash":
            zeros = torch.zeros(t, t, dtype=compute, device=device)
            band = zeros.masked_fill(band, float("-inf"))
    return causal, band
