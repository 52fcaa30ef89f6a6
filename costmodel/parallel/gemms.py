"""The matmuls of one device and what their shapes cost on a GPU (pure; FLOPs, bytes, s).

Each matmul is (n x k)(k x n2) with n rows (tokens of the micro-batch, or the share of them
routing sends an expert): 2·n·k·n2 FLOPs and its three operands in the compute dtype moved
once (Williams et al. 2009, roofline). Its backward is two matmuls of the same FLOPs: dX,
an n x k result, and dW, a k x n2 one.

A GPU computes a GEMM's result tile by tile, one tile per streaming multiprocessor at a
time, so it pays for whole tiles and whole waves of tiles (NVIDIA, "Matrix Multiplication
Background User's Guide", Deep Learning Performance docs: tile quantization and wave
quantization). Where a GEMM has fewer tiles than the device has SMs, cuBLAS and CUTLASS
split the reduction dimension over the idle ones (split-K), so a wave is at least half full.
The achieved rate is ``C_eff`` times the useful fraction of the tiles and waves run; the
hardware profile's ``sm_count`` and ``gemm_tile`` say how a device tiles (a profile without
them, a CPU or a TPU, runs every shape at ``C_eff``).
"""

from __future__ import annotations

import sympy as sp

from costmodel.parallel.experts import busiest_experts
from costmodel.single.finetune import adapted, tunes
from costmodel.single.params import attention_matrices, ffn_matrices
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols import (
    C_eff,
    D,
    E_r,
    E_s,
    F,
    F_e,
    H,
    K,
    N_ep,
    N_sm,
    V,
    W_hbm,
    Y,
    at_least_one,
    d_h,
    k_r,
    r_a,
    smax,
    t_m,
    t_n,
)

Gemm = tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr]
"""(rows per token, k, n2, how many) of one kind of matmul in an op."""


def matmul_shapes(model: ModelSpec) -> dict[str, list[tuple[sp.Expr, sp.Expr]]]:
    """Per-device (k, n2) of each op's matmuls under tensor parallelism Y."""
    up = [(D, F / Y)] * (ffn_matrices(model) - 1)
    shapes = {"ffn": [*up, (F / Y, D)]}
    if model.mla:  # its latents (MLA runs without tensor parallelism)
        for op, fan_in, fan_out in attention_matrices(model):
            shapes.setdefault(op, []).append((fan_in, fan_out))
        shapes["lm_head"] = [(D, V / Y)]
    elif not model.ffn_only:
        shapes.update(
            {
                "attn_q": [(D, H * d_h / Y)],
                "attn_k": [(D, K * d_h / Y)],
                "attn_v": [(D, K * d_h / Y)],
                "attn_o": [(H * d_h / Y, D)],
                "lm_head": [(D, V / Y)],
            }
        )
    return shapes


def moe_gemms(model: ModelSpec) -> dict[str, list[Gemm]]:
    """An MoE block's matmuls on one device: the router over every token; each of the
    device's E/ep routed experts over the k·ep/E share of its ep group's tokens routing
    sends it (balanced routing, times ``ep_imbalance`` on the busiest rank; its weights are
    read once per step whatever it gets); the shared experts as one FFN of their summed
    width (none when E_s is 0)."""
    up = ffn_matrices(model) - 1
    shared = at_least_one(E_s)
    rows, experts = k_r * N_ep / E_r * busiest_experts(), E_r / N_ep
    gate = [(sp.Integer(1), D, sp.Integer(1), sp.Integer(1))] if model.shared_expert_gate else []
    return {
        "router": [(sp.Integer(1), D, E_r, sp.Integer(1)), *gate],
        "experts": [(rows, D, F_e, up * experts), (rows, F_e, D, experts)],
        "shared_experts": [(shared, D, E_s * F_e, sp.Integer(up)), (shared, E_s * F_e, D, 1)],
    }


def all_gemms(model: ModelSpec, train: TrainSpec | None = None) -> dict[str, list[Gemm]]:
    """Every op's matmuls as (rows per token, k, n2, how many) on one device; with a
    fine-tuning ``train``, its adapters' (x A: k = fan-in, n2 = r; then B: k = r)."""
    gemms = {op: [(sp.Integer(1), k, n2, sp.Integer(1)) for k, n2 in shapes]
             for op, shapes in matmul_shapes(model).items()}  # fmt: skip
    if model.moe:
        gemms.update(moe_gemms(model))
    if train is not None and tunes(train):
        one = sp.Integer(1)
        gemms["lora"] = [g for _, k, n2, c in adapted(model, train)
                         for g in ((one, k, r_a, c), (one, r_a, n2, c))]  # fmt: skip
    return gemms


def tile_slots(rows: sp.Expr, cols: sp.Expr) -> sp.Expr:
    """Tile-times a GPU spends on a ``rows`` x ``cols`` GEMM result: whole ``t_m`` x ``t_n``
    tiles (tile quantization) in whole waves of ``N_sm`` (wave quantization), where a wave
    of fewer tiles than SMs splits each tile's reduction over s = floor(N_sm / tiles) SMs
    (split-K), so it costs N_sm / s of them. 0 for an empty result."""
    tiles = sp.ceiling(rows / t_m) * sp.ceiling(cols / t_n)
    slices = smax(1, sp.floor(N_sm / smax(tiles, 1)))
    return sp.ceiling(tiles * slices / N_sm) * N_sm / slices


def wave_efficiency(rows: sp.Expr, cols: sp.Expr) -> sp.Expr:
    """The useful fraction of the tile-times a GEMM result costs (:func:`tile_slots`): 1
    where rows and cols are whole tiles filling whole waves, at least 1/2 of the wave part
    whatever the tile count."""
    return rows * cols / (t_m * t_n * tile_slots(rows, cols))


def gemm_cost(n: sp.Expr, k: sp.Expr, n2: sp.Expr, nbytes: int) -> tuple[sp.Expr, sp.Expr]:
    """(FLOPs, bytes) of one (n x k)(k x n2) matmul in a dtype of ``nbytes``."""
    return 2 * n * k * n2, nbytes * (n * k + k * n2 + n * n2)


def gemm_seconds(
    n: sp.Expr, k: sp.Expr, n2: sp.Expr, nbytes: int, frozen: bool = False
) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) seconds of one (n x k)(k x n2) matmul and of its dX (an n x k
    result over n2) and dW (k x n2 over n; none for a ``frozen`` weight): each the longer
    of the FLOPs its result's tiles run, 2·depth·t_m·t_n per tile-time, at ``C_eff`` and
    its operands' bytes at the HBM rate."""
    moved = gemm_cost(n, k, n2, nbytes)[1]

    def one(rows: sp.Expr, cols: sp.Expr, depth: sp.Expr) -> sp.Expr:
        run = 2 * depth * t_m * t_n * tile_slots(rows, cols)
        return smax(run / C_eff, moved / W_hbm)

    return one(n, n2, k), one(n, k, n2) + (0 if frozen else one(k, n2, n))
