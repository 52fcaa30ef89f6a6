"""FlashAttention-2 forward and backward as Triton kernels (Dao 2023, Algorithms 1 and 2).

Forward: one program per (query tile, batch·head) streams key/value tiles with an online
softmax in fp32 and writes O and the logsumexp L. Backward: a preprocessing kernel for
D = rowsum(dO ∘ O); one kernel per key tile accumulates dK and dV over query tiles; one per
query tile accumulates dQ over key tiles (two passes instead of atomics: deterministic).
Causal masking is top-left aligned and the loops skip tiles entirely above the diagonal.
Any sequence length (masked loads at the edges), head dims 16–128 (padded to a power of
two), fp32 / bf16 / fp16 inputs. On CUDA the tile sizes are autotuned per shape; without
CUDA the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by
``validate.reference.attention`` before this module loads), for correctness, not speed.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from validate.reference.attention.flash_pytorch import AttentionFunction

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED and type(tl.zeros).__name__ != "InterpretedFunction":
    raise ImportError(
        "triton was imported before TRITON_INTERPRET=1 was set: import "
        "validate.reference.attention first, or set TRITON_INTERPRET=1 in the environment"
    )
_TILES = [(bm, bn, w) for bm in (64, 128) for bn in (32, 64) for w in (4, 8)]
_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=2) for bm, bn, w in _TILES
]
_INTERPRETER_TILE = 16


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """a @ b accumulated in fp32; UPCAST widens bf16 operands first, for the interpreter,
    whose dot multiplies bf16's uint16 storage as integers (bf16 products are exact in
    fp32, so this matches tensor cores)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


@triton.jit
def _load(ptr, rows, n_rows, offs_d, head_dim):
    mask = (rows < n_rows)[:, None] & (offs_d < head_dim)[None, :]
    return tl.load(ptr + rows[:, None] * head_dim + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _store(ptr, rows, n_rows, offs_d, head_dim, value):
    mask = (rows < n_rows)[:, None] & (offs_d < head_dim)[None, :]
    tl.store(ptr + rows[:, None] * head_dim + offs_d[None, :], value, mask=mask)


@triton.jit
def _query_tile(Q, DO, L, Delta, bh, rows, n_q, offs_d, head_dim):
    """A query tile's q, dO, logsumexp and D (zeros past the sequence)."""
    q = _load(Q + bh * n_q * head_dim, rows, n_q, offs_d, head_dim)
    do = _load(DO + bh * n_q * head_dim, rows, n_q, offs_d, head_dim)
    lse = tl.load(L + bh * n_q + rows, mask=rows < n_q, other=0.0)
    delta = tl.load(Delta + bh * n_q + rows, mask=rows < n_q, other=0.0)
    return q, do, lse, delta


@triton.jit
def _probs(q, k, rows, cols, n_q, n_k, lse, scale, CAUSAL: tl.constexpr, UPCAST: tl.constexpr):
    """P = exp(S - L) of one tile, zero where masked or outside the sequences."""
    s = _dot(q, tl.trans(k), UPCAST) * scale
    valid = (rows < n_q)[:, None] & (cols < n_k)[None, :]
    if CAUSAL:
        valid = valid & (cols[None, :] <= rows[:, None])
    return tl.where(valid, tl.exp(s - lse[:, None]), 0.0)


@triton.jit
def _fwd_kernel(
    Q, K, V, Out, L, n_q, n_k, head_dim, scale,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load(Q + bh * n_q * head_dim, rows, n_q, offs_d, head_dim)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(n_k, (pid_m + 1) * BLOCK_M) if CAUSAL else n_k
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = _load(K + bh * n_k * head_dim, cols, n_k, offs_d, head_dim)
        v = _load(V + bh * n_k * head_dim, cols, n_k, offs_d, head_dim)
        s = _dot(q, tl.trans(k), UPCAST) * scale
        valid = (cols < n_k)[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST)
        m_i = m_new
    out = acc / l_i[:, None]
    _store(Out + bh * n_q * head_dim, rows, n_q, offs_d, head_dim, out.to(Out.dtype.element_ty))
    tl.store(L + bh * n_q + rows, m_i + tl.log(l_i), mask=rows < n_q)


@triton.jit
def _bwd_delta_kernel(Out, DO, Delta, n_q, head_dim, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load(Out + bh * n_q * head_dim, rows, n_q, offs_d, head_dim).to(tl.float32)
    do = _load(DO + bh * n_q * head_dim, rows, n_q, offs_d, head_dim).to(tl.float32)
    tl.store(Delta + bh * n_q + rows, tl.sum(o * do, 1), mask=rows < n_q)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, L, Delta, DK, DV, n_q, n_k, head_dim, scale,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _load(K + bh * n_k * head_dim, cols, n_k, offs_d, head_dim)
    v = _load(V + bh * n_k * head_dim, cols, n_k, offs_d, head_dim)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    first = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start in range(first, n_q, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        q, do, lse, delta = _query_tile(Q, DO, L, Delta, bh, rows, n_q, offs_d, head_dim)
        p = _probs(q, k, rows, cols, n_q, n_k, lse, scale, CAUSAL, UPCAST)
        dv += _dot(tl.trans(p).to(do.dtype), do, UPCAST)
        ds = p * (_dot(do, tl.trans(v), UPCAST) - delta[:, None])
        dk += _dot(tl.trans(ds).to(q.dtype), q, UPCAST)
    _store(
        DK + bh * n_k * head_dim, cols, n_k, offs_d, head_dim, (dk * scale).to(DK.dtype.element_ty)
    )
    _store(DV + bh * n_k * head_dim, cols, n_k, offs_d, head_dim, dv.to(DV.dtype.element_ty))


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, L, Delta, DQ, n_q, n_k, head_dim, scale,
    CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q, do, lse, delta = _query_tile(Q, DO, L, Delta, bh, rows, n_q, offs_d, head_dim)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(n_k, (pid_m + 1) * BLOCK_M) if CAUSAL else n_k
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = _load(K + bh * n_k * head_dim, cols, n_k, offs_d, head_dim)
        v = _load(V + bh * n_k * head_dim, cols, n_k, offs_d, head_dim)
        p = _probs(q, k, rows, cols, n_q, n_k, lse, scale, CAUSAL, UPCAST)
        ds = p * (_dot(do, tl.trans(v), UPCAST) - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, UPCAST)
    _store(
        DQ + bh * n_q * head_dim, rows, n_q, offs_d, head_dim, (dq * scale).to(DQ.dtype.element_ty)
    )


_KEY = ["n_q", "n_k", "head_dim"]
_fwd_tuned = triton.autotune(_CONFIGS, key=_KEY)(_fwd_kernel)
_dkdv_tuned = triton.autotune(_CONFIGS, key=_KEY, reset_to_zero=None)(_bwd_dkdv_kernel)
_dq_tuned = triton.autotune(_CONFIGS, key=_KEY)(_bwd_dq_kernel)


def _launch(plain, tuned, grid_rows: str, n_rows: int, bh: int, *args, **consts) -> None:
    """Fixed small tiles in the interpreter; autotuned tiles on a GPU."""
    if INTERPRETED:
        tiles = {"BLOCK_M": _INTERPRETER_TILE, "BLOCK_N": _INTERPRETER_TILE}
        plain[(triton.cdiv(n_rows, tiles[grid_rows]), bh)](*args, **consts, **tiles)
    else:
        tuned[lambda meta: (triton.cdiv(n_rows, meta[grid_rows]), bh)](*args, **consts)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


def _check(q, k, v) -> None:
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
    ):
        raise ValueError(
            f"q, k, v must share dtype fp32, bf16 or fp16 (got {q.dtype}, {k.dtype}, {v.dtype})"
        )
    if not 16 <= q.shape[-1] <= 128:
        raise ValueError(f"head dim must be in 16..128 (got {q.shape[-1]})")
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes must be (..., N, d) alike (got {q.shape}, {k.shape}, {v.shape})")


class FlashAttentionTriton(AttentionFunction):
    """``FlashAttentionTriton.apply(q, k, v, is_causal=False)``; saves q, k, v, O and L."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        _check(q, k, v)
        (n_q, d), n_k = q.shape[-2:], k.shape[-2]
        q3, k3, v3 = _flat(q), _flat(k), _flat(v)
        o = torch.empty_like(q3)
        lse = torch.empty(q3.shape[:-1], dtype=torch.float32, device=q.device)
        block_d = max(16, triton.next_power_of_2(d))
        consts = {"CAUSAL": bool(is_causal), "UPCAST": INTERPRETED, "BLOCK_D": block_d}
        scale = 1.0 / d**0.5
        _launch(_fwd_kernel, _fwd_tuned, "BLOCK_M", n_q, q3.shape[0],
                q3, k3, v3, o, lse, n_q, n_k, d, scale, **consts)  # fmt: skip
        o, lse = o.view(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = bool(is_causal)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        (n_q, d), n_k, bh = q.shape[-2:], k.shape[-2], q.numel() // (q.shape[-2] * q.shape[-1])
        q3, k3, v3, o3, do3 = (_flat(t) for t in (q, k, v, o, do.to(q.dtype)))
        block_d = max(16, triton.next_power_of_2(d))
        delta = torch.empty(q3.shape[:-1], dtype=torch.float32, device=q.device)
        rows = 16 if INTERPRETED else 64
        _bwd_delta_kernel[(triton.cdiv(n_q, rows), bh)](
            o3, do3, delta, n_q, d, BLOCK_M=rows, BLOCK_D=block_d
        )
        dq, dk, dv = torch.empty_like(q3), torch.empty_like(k3), torch.empty_like(v3)
        consts = {"CAUSAL": ctx.is_causal, "UPCAST": INTERPRETED, "BLOCK_D": block_d}
        common = (q3, k3, v3, do3, lse, delta)
        scale = 1.0 / d**0.5
        _launch(_bwd_dkdv_kernel, _dkdv_tuned, "BLOCK_N", n_k, bh,
                *common, dk, dv, n_q, n_k, d, scale, **consts)  # fmt: skip
        _launch(_bwd_dq_kernel, _dq_tuned, "BLOCK_M", n_q, bh,
                *common, dq, n_q, n_k, d, scale, **consts)  # fmt: skip
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None
