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

from typing import TYPE_CHECKING

from costmodel.kinds import attention, ffn
from costmodel.kinds.ffn import Gemm
from costmodel.single.finetune import adapted, tunes
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols.core import (
    C_eff,
    D,
    N_sm,
    V,
    W_hbm,
    Y,
    k_half,
    l_ex,
    r_a,
    r_grp,
    sceil,
    sfloor,
    smax,
    t_m,
    t_n,
)
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

__all__ = ["Gemm", "all_gemms", "gemm_cost", "gemm_seconds", "matmul_shapes", "tile_slots",
           "wave_efficiency"]  # fmt: skip


def matmul_shapes(
    model: ModelSpec, sequence_parallel: bool = False
) -> dict[str, list[tuple[sp.Expr, sp.Expr, sp.Expr]]]:
    """Per-device (rows per token, k, n2) of each attention op's matmuls (and the head's)
    under tensor parallelism Y (``Projections.shapes``)."""
    if model.ffn_only:
        return {}
    one = integer(1)
    return {**attention.projections(model).shapes(model, sequence_parallel),
            "lm_head": [(one, D, V / Y)]}  # fmt: skip


def all_gemms(
    model: ModelSpec, train: TrainSpec | None = None, sequence_parallel: bool = False
) -> dict[str, list[Gemm]]:
    """Every op's matmuls as (rows per token, k, n2, how many) on one device: attention's
    and the head's, and each FFN kind's (``FFNKind.gemms``); with a fine-tuning ``train``,
    its adapters' (x A: k = fan-in, n2 = r; then B: k = r)."""
    shapes = matmul_shapes(model, sequence_parallel)
    head = shapes.pop("lm_head", None)
    gemms = {op: [(rows, k, n2, integer(1)) for rows, k, n2 in triples]
             for op, triples in shapes.items()}  # fmt: skip
    for kind, _ in ffn.blocks(model):
        gemms.update(kind.gemms(model))
    if head is not None:
        gemms["lm_head"] = [(rows, k, n2, integer(1)) for rows, k, n2 in head]
    if train is not None and tunes(train):
        one = integer(1)
        gemms["lora"] = [g for _, k, n2, c in adapted(model, train)
                         for g in ((one, k, r_a, c), (one, r_a, n2, c))]  # fmt: skip
    return gemms


def tile_slots(rows: sp.Expr, cols: sp.Expr) -> sp.Expr:
    """Tile-times a GPU spends on a ``rows`` x ``cols`` GEMM result: whole ``t_m`` x ``t_n``
    tiles (tile quantization) in whole waves of ``N_sm`` (wave quantization), where a wave
    of fewer tiles than SMs splits each tile's reduction over s = floor(N_sm / tiles) SMs
    (split-K), so it costs N_sm / s of them. 0 for an empty result."""
    tiles = sceil(rows / t_m) * sceil(cols / t_n)
    slices = smax(1, sfloor(N_sm / smax(tiles, 1)))
    return sceil(tiles * slices / N_sm) * N_sm / slices


def wave_efficiency(rows: sp.Expr, cols: sp.Expr) -> sp.Expr:
    """The useful fraction of the tile-times a GEMM result costs (:func:`tile_slots`): 1
    where rows and cols are whole tiles filling whole waves, at least 1/2 of the wave part
    whatever the tile count."""
    return rows * cols / (t_m * t_n * tile_slots(rows, cols))


def gemm_cost(n: sp.Expr, k: sp.Expr, n2: sp.Expr, nbytes: int) -> tuple[sp.Expr, sp.Expr]:
    """(FLOPs, bytes) of one (n x k)(k x n2) matmul in a dtype of ``nbytes``: 2·n·k·n2
    and nbytes·(n·k + k·n2 + n·n2) (the sizes of one reading grouped first: n is the
    array in a sweep, one operation instead of three)."""
    return 2 * k * n2 * n, nbytes * (n * (k + n2) + k * n2)


def gemm_seconds(
    n: sp.Expr, k: sp.Expr, n2: sp.Expr, nbytes: int, frozen: bool = False,
    grouped: bool = False, moved: sp.Expr | None = None,
) -> tuple[sp.Expr, sp.Expr]:  # fmt: skip
    """(forward, backward) seconds of one (n x k)(k x n2) matmul and of its dX (an n x k
    result over n2) and dW (k x n2 over n; none for a ``frozen`` weight): each the longer
    of the FLOPs its result's tiles run, 2·depth·t_m·t_n per tile-time, at ``C_eff`` times
    depth / (depth + ``k_half``) (the profile's ``gemm_half_depth`` of the dtype: Hopper's
    fp8 GEMMs, measured, fall from 0.89 of bf16's efficiency at k = 8,192 to 0.73 at 768)
    and its operands' bytes at the HBM rate. ``grouped``: one routed expert's problem, which
    a grouped linear that loops over the experts on the host (``l_ex``: Transformer Engine's
    GroupedLinear, one cuBLAS GEMM per expert on a pool of streams) runs at ``r_grp``
    (``efficiency.grouped``) of that efficiency, and one grouped kernel at all of it.
    ``moved``: the operands' bytes where the caller has them (:func:`gemm_cost`)."""
    moving = (gemm_cost(n, k, n2, nbytes)[1] if moved is None else moved) / W_hbm
    per_slot = 2 * t_m * t_n / (C_eff * (1 - l_ex * (1 - r_grp)) if grouped else C_eff)

    def one(rows: sp.Expr, cols: sp.Expr, depth: sp.Expr) -> sp.Expr:
        slower = 1 + k_half / smax(depth, 1)  # an empty GEMM (depth 0) runs nothing
        return smax(per_slot * slower * depth * tile_slots(rows, cols), moving)

    return one(n, n2, k), one(n, k, n2) + (0 if frozen else one(k, n2, n))
