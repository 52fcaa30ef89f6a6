"""One attention call softmax(Q Kᵀ/√d) V on (batch b, heads h, sequence N, head dim d).

Per kernel (``naive``: PyTorch ops that materialise the N x N scores and probabilities;
``flash``: FlashAttention-2, tiled, keeping only O and the logsumexp L), with e bytes per
element of the inputs:

FLOPs (2 per multiply-add, matmuls only). ``counted`` is torch's FlopCounterMode
convention (dense N², causal or not: ``sdpa_flop``); ``executed`` is the work a kernel
does: the naive kernel computes every score, a causal flash kernel skips the tiles above
the diagonal and computes T(T+1)/2 of the T² tile pairs (T = ⌈N/B⌉; Dao 2023, Sec.
3.1.1). Forward 4·b·h·N²·d (QKᵀ and PV); backward 8·b·h·N²·d for naive (dV, dP, dQ,
dK) and 10 for flash, which recomputes QKᵀ (Dao 2023, Algorithm 2).

Memory (bytes live, inputs q, k, v included; the caller holds O and later dO):
``after_forward`` = q, k, v, O plus what backward keeps: naive the probabilities P (and
the N x N bool mask when causal); flash the fp32 logsumexp L. ``peak`` (during backward):
naive adds dO, dV and three N x N tensors at the softmax backward (P, dP and dS); flash
adds dO, dQ, dK, dV and the fp32 D = rowsum(dO ∘ O) (Dao 2023, Algorithm 2, line 4).

HBM traffic, every read and write once per kernel (Dao et al. 2022, Theorem 2: Θ(Nd + N²)
for standard attention, Θ(N²d²/M) for flash): the naive forward writes and reads the
N x N matrices once per op (QKᵀ, scale, mask, softmax, PV); flash forward reads Q once
and K, V once per query tile (T_r = ⌈N/B⌉ times, about half when causal), writes O and
L; flash backward, as two kernels (dK/dV looping over query tiles, dQ looping over key
tiles) plus the D preprocessing, reads K, V, Q, dO, L, D once per tile pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.specs import checks
from costmodel.specs.hardware import Hardware
from costmodel.symbols.core import B_tile, T, as_expr, d_h, h_call
from costmodel.symbols.core import b as b_seq
from costmodel.symbols.ops import ratio, sceil

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

KERNELS = ("naive", "flash")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# One call's symbols: the global b (sequences), T (its length) and d_h (head width), plus
# the heads in the call and the flash tile, declared in costmodel.symbols.
b, N, d, h, tile = b_seq, T, d_h, h_call, B_tile


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """One attention call; errors name the field."""

    batch: int
    seq: int
    head_dim: int
    heads: int = 1
    kernel: str = "flash"
    dtype: str = "fp32"
    causal: bool = False
    tile: int = 64
    """Square tile size B of the flash kernel (rows of Q and of K/V per block)."""

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "head_dim", "heads", "tile"):
            checks.integer(name, getattr(self, name))
        checks.choice("kernel", self.kernel, KERNELS)
        checks.choice("dtype", self.dtype, tuple(DTYPE_BYTES))
        checks.flag("causal", self.causal)
        if self.tile > self.seq:  # a block of rows past the sequence is not a kernel's tile
            raise checks.SpecError("tile", f"tile must be at most seq: a flash kernel's blocks "
                                   f"are rows of the sequence (got tile={self.tile}, "
                                   f"seq={self.seq})")  # fmt: skip


def _tiles() -> sp.Expr:
    return sceil(N / tile)


def attention_costs(kernel: str, causal: bool, e: int) -> dict[str, sp.Expr]:
    """Expressions in b, h, N, d, B for one kernel (bytes, FLOPs)."""
    dense_fwd = 4 * b * h * N**2 * d
    mats = b * h * N * d  # elements of one of q, k, v, O
    square = b * h * N**2
    mask = N**2 if causal else 0  # one bool mask, broadcast over batch and heads
    tiles = _tiles()
    pairs = tiles * (tiles + 1) / 2 if causal else tiles**2  # tile pairs computed
    if kernel == "naive":
        fwd_exec, bwd_count = dense_fwd, 2 * dense_fwd
        after = e * (4 * mats + square) + mask
        peak = e * (6 * mats + 3 * square) + mask
        # forward: QKᵀ writes S; scale r/w; mask r/w (+ bool read); softmax r/w; PV reads P
        hbm_fwd = e * (4 * mats + (7 if causal else 5) * square) + (b * h * N**2 if causal else 0)
        # backward: dP write, P read (dV), softmax bwd 3, mask bwd 2, scale 2, dS read twice
        hbm_bwd = e * (8 * mats + (11 if causal else 9) * square) + (b * h * N**2 if causal else 0)
    else:
        per_tile = 4 * b * h * tile**2 * d
        fwd_exec, bwd_count = per_tile * pairs, ratio(5, 2) * dense_fwd
        after = e * 4 * mats + 4 * b * h * N
        peak = e * 8 * mats + 8 * b * h * N
        kv_passes = (tiles + 1) / 2 if causal else tiles
        hbm_fwd = e * (2 * mats + 2 * mats * kv_passes) + 4 * b * h * N
        # D: read dO, O, write D; dK/dV: read K, V, write dK, dV, per pass Q, dO (+ L, D);
        # dQ: read Q, dO, L, D, write dQ, per pass K, V
        hbm_bwd = e * (
            2 * mats + 4 * mats + 2 * mats * kv_passes + 3 * mats + 2 * mats * kv_passes
        ) + 4 * b * h * N * (1 + 2 * kv_passes + 2)
    return {
        "flops.forward": dense_fwd,
        "flops.backward": bwd_count,
        "flops.forward_executed": fwd_exec,
        "flops.backward_executed": ratio(5, 2) * fwd_exec if kernel == "flash" else bwd_count,
        "memory_bytes.after_forward": after,
        "memory_bytes.peak": peak,
        "hbm_bytes.forward": hbm_fwd,
        "hbm_bytes.backward": hbm_bwd,
        "hbm_bytes": hbm_fwd + hbm_bwd,
    }


def attention_estimate(spec: AttentionSpec) -> dict[str, int]:
    """Every quantity of one call as exact integers (bytes, FLOPs)."""
    values = {b: spec.batch, h: spec.heads, N: spec.seq, d: spec.head_dim, tile: spec.tile}
    exprs = attention_costs(spec.kernel, spec.causal, DTYPE_BYTES[spec.dtype])
    return {k: int(as_expr(v).subs(values)) for k, v in exprs.items()}


def attention_time(spec: AttentionSpec, hw: Hardware) -> dict[str, float]:
    """Roofline seconds of forward and backward on ``hw`` (Williams et al. 2009), and for
    the fused kernel its seconds at the device's kernel rate alone.

    Each pass takes max(executed FLOPs / rate, HBM bytes / bandwidth); the naive kernel's
    matmuls run at the matmul rate, the fused kernel at the device's default attention
    kernel's rate for that pass and sequence length (``Hardware.attention_peak``). The
    fused kernel's bytes are this tile's (K and V read once per query tile, no reuse in
    the L2 cache), which a small tile makes the larger term; its rate, measured on the
    whole kernel where the profile has a table, already holds what its real traffic costs,
    so ``time_s.{pass}_kernel`` (FLOPs at that rate: what ``estimate`` prices the core at)
    is the time to expect and the roofline the bound of the tile's traffic."""
    est = attention_estimate(spec)
    bandwidth = hw.hbm_bandwidth()
    out = {}
    for p in ("forward", "backward"):
        rate = (
            hw.attention_peak(spec.dtype, "auto", p, spec.seq)
            if spec.kernel == "flash"
            else hw.matmul_flops(spec.dtype)
        )
        flops, nbytes = est[f"flops.{p}_executed"], est[f"hbm_bytes.{p}"]
        out[f"time_s.{p}"] = max(flops / float(rate), nbytes / bandwidth)
        if spec.kernel == "flash":
            out[f"time_s.{p}_kernel"] = flops / float(rate)
    return out
