"""FlashAttention-2 in PyTorch tiles: the reference for the algorithm (Dao 2023).

Forward (Algorithm 1): for each query tile, stream key/value tiles with an online softmax
(running max m, running sum l, unnormalised output), never forming the N x N matrix;
save O and the logsumexp L = m + log l. Backward (Algorithm 2): recompute each tile's
probabilities P = exp(S - L) from L, with D = rowsum(dO ∘ O), dS = P ∘ (dP - D).
Causal masking is top-left aligned (query i sees keys j <= i, as ``is_causal`` in
``scaled_dot_product_attention``) and skips tiles entirely above the diagonal. Works on
``(batch, seq, d)`` and ``(batch, heads, seq, d)``; accumulates in fp32 (fp64 inputs in fp64).
"""

from __future__ import annotations

import math

import torch

TILE = 32


def _tile_scores(qi, kj, scale, i0, j0, causal):
    s = (qi @ kj.transpose(-2, -1)) * scale
    if causal and j0 + kj.shape[-2] - 1 > i0:  # the tile crosses the diagonal
        rows = torch.arange(i0, i0 + qi.shape[-2], device=qi.device)[:, None]
        cols = torch.arange(j0, j0 + kj.shape[-2], device=qi.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


def _acc_dtype(q: torch.Tensor) -> torch.dtype:
    """fp32 accumulation (fp64 stays fp64, for gradient checks)."""
    return torch.promote_types(q.dtype, torch.float32)


def _key_end(i1: int, n_k: int, causal: bool) -> int:
    """Keys a query tile ending at row i1 (exclusive) can see."""
    return min(n_k, i1) if causal else n_k


def flash_forward(q, k, v, causal: bool, tile: int = TILE):
    """(O in q's dtype, L in fp32)."""
    n_q, n_k, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    acc = _acc_dtype(q)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=acc, device=q.device)
    for i0 in range(0, n_q, tile):
        i1 = min(i0 + tile, n_q)
        qi = q[..., i0:i1, :].to(acc)
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741 (the paper's name)
        out = torch.zeros_like(qi)
        for j0 in range(0, _key_end(i1, n_k, causal), tile):
            j1 = min(j0 + tile, n_k)
            s = _tile_scores(qi, k[..., j0:j1, :].to(acc), scale, i0, j0, causal)
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            correction = torch.exp(m - m_new)
            l = correction * l + p.sum(dim=-1)  # noqa: E741
            out = correction[..., None] * out + p @ v[..., j0:j1, :].to(acc)
            m = m_new
        o[..., i0:i1, :] = (out / l[..., None]).to(q.dtype)
        lse[..., i0:i1] = m + torch.log(l)
    return o, lse


def flash_backward(q, k, v, o, lse, do, causal: bool, tile: int = TILE):
    """(dq, dk, dv) in the inputs' dtypes, from the saved O and L."""
    n_q, n_k, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    acc = _acc_dtype(q)
    delta = (do.to(acc) * o.to(acc)).sum(dim=-1)  # D = rowsum(dO ∘ O)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=q.device)
    dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    for j0 in range(0, n_k, tile):
        j1 = min(j0 + tile, n_k)
        kj, vj = k[..., j0:j1, :].to(acc), v[..., j0:j1, :].to(acc)
        first = j0 - j0 % tile if causal else 0  # query tiles that see this key tile
        for i0 in range(first, n_q, tile):
            i1 = min(i0 + tile, n_q)
            qi, doi = q[..., i0:i1, :].to(acc), do[..., i0:i1, :].to(acc)
            s = _tile_scores(qi, kj, scale, i0, j0, causal)
            p = torch.exp(s - lse[..., i0:i1, None])
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ doi
            ds = p * (doi @ vj.transpose(-2, -1) - delta[..., i0:i1, None])
            dq[..., i0:i1, :] += (ds @ kj) * scale
            dk[..., j0:j1, :] += (ds.transpose(-2, -1) @ qi) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class AttentionFunction(torch.autograd.Function):
    """``apply(q, k, v, is_causal=False)`` with keywords (``Function.apply`` takes none)."""

    @classmethod
    def apply(cls, q, k, v, is_causal: bool = False):
        return super().apply(q, k, v, is_causal)


class FlashAttentionPytorch(AttentionFunction):
    """``FlashAttentionPytorch.apply(q, k, v, is_causal=False)``; saves q, k, v, O and L."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = flash_forward(q, k, v, bool(is_causal))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = bool(is_causal)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*flash_backward(q, k, v, o, lse, do, ctx.is_causal), None)
