"""GEMM tile and wave quantization (NVIDIA, "Matrix Multiplication Background User's
Guide": a GPU pays for whole tiles in whole waves of its SMs; split-K fills a short wave),
worked by hand on the A100's 108 SMs and the H100's 132 with 256 x 128 tiles (issue 12)."""

from __future__ import annotations

import dataclasses

import pytest
import sympy as sp

from costmodel import ParallelSpec, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.parallel.gemms import gemm_seconds, tile_slots, wave_efficiency
from costmodel.specs.checks import SpecError
from costmodel.symbols import C_eff, N_sm, W_hbm, k_half, t_m, t_n

A100 = {N_sm: 108, t_m: 256, t_n: 128}
H100 = get_hardware("h100-sxm")


def q(rows: int, cols: int, tiling: dict = A100) -> float:
    return float(wave_efficiency(sp.Integer(rows), sp.Integer(cols)).subs(tiling))


@pytest.mark.parametrize(
    ("rows", "cols", "expected", "why"),
    [
        (3072, 2304, 1.0, "12 x 18 = 216 tiles: two full waves of 108"),
        (3072, 2432, 228 / 324, "12 x 19 = 228 tiles: a third wave of 12"),
        (3073, 2304, 3073 / 3328 * 234 / 324, "a 13th row of tiles, one row used"),
        (2048, 128, 8 * 13 / 108, "8 tiles split 13 ways: 104 of 108 SMs"),
        (256, 128, 108 / 108, "one tile split over every SM"),
    ],
)
def test_tiles_and_waves_by_hand(rows, cols, expected, why):
    assert q(rows, cols) == pytest.approx(expected, rel=1e-12), why


def test_split_k_keeps_a_short_wave_at_least_half_full():
    """Every tile count to 400, compiled once (substituting each took 30 s); the compiled
    form is checked against substitution at every 50th."""
    rows = sp.Symbol("rows", positive=True, integer=True)
    slots_of = sp.lambdify(rows, tile_slots(rows, sp.Integer(128)).subs(A100))
    for tiles in range(1, 400):
        slots = float(slots_of(256 * tiles))
        if tiles % 50 == 0:
            assert slots == float(tile_slots(sp.Integer(256 * tiles), sp.Integer(128)).subs(A100))
        assert tiles / slots >= 0.5 - 1e-12, tiles


def test_without_an_sm_count_every_whole_shape_runs_at_the_rate():
    """A profile with no SM count (CPU, TPU) tiles 1 x 1 on one unit: no loss."""
    cpu = dict(zip((N_sm, t_m, t_n), get_hardware("cpu").gemm_tiling(), strict=True))
    assert cpu == {N_sm: 1, t_m: 1, t_n: 1}
    for rows, cols in ((1, 1), (37, 4096), (3073, 2432)):
        assert q(rows, cols, cpu) == 1.0


def test_an_empty_result_costs_nothing():
    """An MoE model without shared experts has zero-row GEMMs: no time, no division."""
    fwd, bwd = gemm_seconds(sp.Integer(0), sp.Integer(4096), sp.Integer(14336), 2)
    values = {**A100, C_eff: 1e14, W_hbm: 1e12}
    assert float(fwd.subs(values)) == pytest.approx(2 * 4096 * 14336 / 1e12)  # the weights
    assert float(bwd.subs(values)) >= 0


def test_backward_prices_dx_and_dw_by_their_own_results():
    """(n x k)(k x n2), n = k = 4096, n2 = 1024, on 132 SMs: the forward's and dW's 4096 x
    1024 results are 16 x 8 = 128 tiles, one wave of 132 (split-K cannot double 128 tiles);
    dX's 4096 x 4096 result is 512 tiles, four waves (528 tile-times)."""
    n, k, n2 = (sp.Integer(x) for x in (4096, 4096, 1024))
    values = {N_sm: 132, t_m: 256, t_n: 128, C_eff: 1e15, W_hbm: 1e15, k_half: 0}
    fwd, bwd = (float(e.subs(values)) for e in gemm_seconds(n, k, n2, 2))
    at_rate = 2 * 4096 * 4096 * 1024 / 1e15
    assert fwd == pytest.approx(at_rate * 132 / 128, rel=1e-12)
    assert bwd == pytest.approx(at_rate * (528 / 512 + 132 / 128), rel=1e-12)


def test_quantization_slows_a_tensor_parallel_step():
    """Llama-3-70B at tp 8 on H100: the per-device GEMMs are narrow, so quantization
    costs time; with no SM count the same step is faster, and MFU stays below HFU <= 1."""
    train = TrainSpec(batch=8, seq=8192, precision="bf16-mixed")
    par = ParallelSpec(framework="megatron", tp=8, sequence_parallel=True)
    model = get_model("llama3-70b")
    tiled = estimate(model, train, par, H100)
    flat = estimate(model, train, par, dataclasses.replace(H100, sm_count=0))
    assert tiled["time_s.compute"] > flat["time_s.compute"]
    assert tiled["mfu"] <= tiled["hfu"] <= 1


@pytest.mark.parametrize(
    ("change", "field"),
    [({"sm_count": -1}, "sm_count"), ({"gemm_tile": [256]}, "gemm_tile"),
     ({"gemm_tile": [256, 0]}, "gemm_tile"), ({"gemm_tile": "256x128"}, "gemm_tile")],
)  # fmt: skip
def test_bad_tiling_names_the_field(change, field):
    with pytest.raises(SpecError) as err:
        dataclasses.replace(H100, **change)
    assert err.value.field == field


def test_fp32_without_tf32_is_not_tiled_as_a_tensor_core_gemm():
    """Issue 36, item 5: single-A100 fp32 steps (CUDA-core SGEMM) were priced with the
    Tensor Core tile and came out 16-46 % slower than before the quantization landed
    (cs336-medium, batch 4 x 512: 580.6 ms against 397.4 ms); they are unquantized again,
    and bf16 keeps its quantization."""
    a100 = get_hardware("a100-80gb")
    assert a100.gemm_tiling("fp32") == (1, 1, 1) and a100.gemm_tiling("tf32") == (108, 256, 128)
    model, par = get_model("cs336-medium"), ParallelSpec()
    fp32 = TrainSpec(batch=4, seq=512, precision="fp32")
    untiled = dataclasses.replace(a100, sm_count=0)
    assert estimate(model, fp32, par, a100)["time_s.step"] == pytest.approx(
        estimate(model, fp32, par, untiled)["time_s.step"], rel=1e-12)  # fmt: skip
    assert estimate(model, fp32, par, a100)["time_s.step"] == pytest.approx(0.3974, abs=1e-4)
    bf16 = fp32.replace(precision="bf16-mixed")
    assert estimate(model, bf16, par, a100)["time_s.step"] > 1.1 * float(
        estimate(model, bf16, par, untiled)["time_s.step"])  # fmt: skip


def test_routed_experts_run_their_gemms_at_the_grouped_efficiency():
    """Issue 57: where a grouped linear loops over the local experts (one cuBLAS GEMM per
    expert), a routed expert's matmuls run at ``efficiency.grouped`` of a dense GEMM's
    efficiency (fitted: record ``grouped_gemm``); at 1, or as one grouped kernel, they cost
    what a dense GEMM of their shape costs. Only the routed experts' op changes: the
    attention's, the router's and a dense model's GEMMs do not."""
    train = TrainSpec(batch=8, seq=4096, precision="bf16-mixed")
    par = ParallelSpec(framework="megatron", ep=8, dp=8)
    grouped = H100.eff("grouped")
    assert 0 < grouped < 1
    dense_rate = dataclasses.replace(H100, efficiency={**H100.efficiency, "grouped": 1.0})
    moe = get_model("mixtral-8x7b")
    fitted, flat = estimate(moe, train, par, H100), estimate(moe, train, par, dense_rate)
    for key in ("roofline.experts.time_s", "roofline.experts.backward_s"):
        assert fitted[key] == pytest.approx(flat[key] / grouped, rel=1e-9)  # compute-bound
    for key in ("roofline.attn_q.time_s", "roofline.attn_o.backward_s", "roofline.router.time_s"):
        assert fitted[key] == flat[key]
    assert fitted["time_s.step"] > flat["time_s.step"]
    # one grouped kernel (torch's _grouped_mm, DeepGEMM) runs at the dense rate; the
    # per-expert loop (Megatron-Core's default, above) at the grouped efficiency
    one_kernel = par.replace(expert_gemm="grouped")
    assert estimate(moe, train, one_kernel, H100)["roofline.experts.time_s"] == pytest.approx(
        flat["roofline.experts.time_s"], rel=1e-12)  # fmt: skip
    llama = get_model("llama3-8b")
    assert estimate(llama, train, par.replace(ep=1), H100)["time_s.step"] == estimate(
        llama, train, par.replace(ep=1), dense_rate)["time_s.step"]  # fmt: skip
