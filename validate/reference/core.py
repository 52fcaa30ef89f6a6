"""The attention core's call, shared by the reference model's attention kinds."""

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
