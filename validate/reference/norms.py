"""RMSNorm and LayerNorm as autograd Functions that keep exactly (x, rstd[, mean]).

Fused kernels (Apex, Transformer Engine, Megatron) keep the input and fp32 statistics; the
torch composites keep more, and differently on different devices, which would make the
activation memory of the reference model device-dependent.
"""

from __future__ import annotations

import torch
from torch import nn


def _wide(t: torch.Tensor) -> torch.Tensor:
    """Statistics in fp32 for 16- and 32-bit inputs, never below the input's precision."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = _wide(x)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd * _wide(weight)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xhat = _wide(x) * rstd
        g = _wide(grad)
        gw = g * _wide(weight)
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dw = (g * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps: float):
        x32 = _wide(x)
        mean = x32.mean(-1, keepdim=True)
        rstd = torch.rsqrt((x32 - mean).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return ((x32 - mean) * rstd * _wide(weight) + _wide(bias)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, rstd = ctx.saved_tensors
        xhat = (_wide(x) - mean) * rstd
        g = _wide(grad)
        gw = g * _wide(weight)
        dx = rstd * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
        flat = x.shape[-1]
        dw = (g * xhat).reshape(-1, flat).sum(0)
        db = g.reshape(-1, flat).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), db.to(weight.dtype), None


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · g (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = 1e-5, **factory) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFn.apply(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + eps) · g + β (Ba et al. 2016)."""

    def __init__(self, dim: int, eps: float = 1e-5, **factory) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory))
        self.bias = nn.Parameter(torch.zeros(dim, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LayerNormFn.apply(x, self.weight, self.bias, self.eps)
