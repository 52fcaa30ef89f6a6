"""FlashAttention-2 (tiled PyTorch and Triton) against naive attention.

Reference: naive attention in fp64 on the same (rounded) inputs. Tolerances on the max
absolute error for unit-variance inputs, per input dtype: fp64 1e-12 (tiled PyTorch
only: it accumulates in fp64 then), fp32 1e-5, fp16 5e-3, bf16 5e-2 (bf16 keeps 8 bits of
mantissa; P and dS are rounded to the input dtype before their matmuls, as in FA2). On
CPU the Triton kernels run in Triton's interpreter; with CUDA they are compiled, and
fp32 matmuls use TF32 (10-bit mantissa), hence the looser fp32 tolerance there.
"""

from __future__ import annotations

import pytest
import torch

from validate.reference.attention import (
    FlashAttentionPytorch,
    compiled_naive_attention,
    logsumexp_reference,
    naive_attention,
    sdpa_attention,
)
from validate.reference.attention.flash_triton import FlashAttentionTriton
from validate.suites.attention import measure_memory, measure_time

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 5e-2}
SHAPES = [(2, 37, 16), (1, 2, 50, 32), (1, 3, 17, 24), (1, 1, 64, 128)]


def _check(fn, shape, dtype, causal, tol, device="cpu"):
    torch.manual_seed(0)
    q, k, v = (torch.randn(*shape, dtype=dtype, device=device, requires_grad=True) for _ in "qkv")
    out = fn(q, k, v, is_causal=causal)
    saved = out.grad_fn.saved_tensors
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = naive_attention(*ref_in, is_causal=causal)
    ref_grads = torch.autograd.grad(ref, ref_in, grad_out.double())
    assert (out.double() - ref).abs().max() <= tol
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == dtype and (got.double() - want).abs().max() <= tol
    # saved for backward: q, k, v, O and exactly one logsumexp of shape (batch[, heads], seq)
    assert len(saved) == 5
    for t, want in zip(saved[:3], (q, k, v), strict=True):
        assert t.data_ptr() == want.data_ptr()
    assert saved[3].shape == out.shape
    lse = saved[4]
    assert lse.shape == shape[:-1] and lse.dtype in (torch.float32, torch.float64)
    lse_ref = logsumexp_reference(*(t.detach().double() for t in (q, k)), is_causal=causal)
    assert (lse.double() - lse_ref).abs().max() <= max(tol, 1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_flash_pytorch_matches_naive(shape, dtype, causal):
    _check(FlashAttentionPytorch.apply, shape, dtype, causal, TOL[dtype])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_flash_triton_matches_naive(shape, dtype, causal):
    tol = 5e-3 if (CUDA and dtype == torch.float32) else TOL[dtype]
    _check(FlashAttentionTriton.apply, shape, dtype, causal, tol, DEVICE)


def test_flash_triton_head_dim_128_odd_length():
    _check(FlashAttentionTriton.apply, (1, 1, 33, 128), torch.float32, True,
           5e-3 if CUDA else 1e-5, DEVICE)  # fmt: skip


@pytest.mark.parametrize("fn", [sdpa_attention, compiled_naive_attention])
def test_other_kernels_agree(fn):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in "qkv")
    for causal in (False, True):
        want = naive_attention(q, k, v, is_causal=causal)
        assert torch.allclose(fn(q, k, v, is_causal=causal), want, atol=1e-5)


def test_the_suite_times_and_measures_a_compiled_kernel_on_fresh_graphs():
    """Each timed backward runs on a graph of its own (a compiled backward frees what it
    saved: retain_graph=True failed for every naive-compiled case on an H100), and the
    memory is measured after a call that compiles, so the compile's buffers are not in it."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 48, 16, requires_grad=True) for _ in "qkv")
    times = measure_time(compiled_naive_attention, q, k, v, torch.device("cpu"))
    assert times["time_s.forward"] > 0 and times["time_s.backward"] >= 0
    eager = measure_memory(naive_attention, q, k, v, torch.device("cpu"))
    assert (
        measure_memory(compiled_naive_attention, q, k, v, torch.device("cpu"))[
            "memory_bytes.after_forward"
        ]
        <= eager["memory_bytes.after_forward"]
    )


def test_flash_triton_rejects_bad_inputs():
    q = torch.randn(1, 8, 8)
    with pytest.raises(ValueError, match=r"head dim must be in 16\.\.128"):
        FlashAttentionTriton.apply(q, q, q)
    q = torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="share dtype"):
        FlashAttentionTriton.apply(q, q.double(), q)


def test_causal_skips_tiles_above_the_diagonal():
    """Keys after every query of a tile are never read: poisoning them changes nothing."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 64, 16) for _ in "qkv")
    want = FlashAttentionPytorch.apply(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, 32:], v2[:, 32:] = float("nan"), float("nan")
    got = FlashAttentionPytorch.apply(q[:, :32], k2, v2, is_causal=True)
    assert torch.equal(got, want[:, :32])


@pytest.mark.parametrize("kernel", ["naive", "sdpa", "flash-triton"])
@pytest.mark.parametrize("causal", [False, True])
def test_costmodel_counts_flops_and_memory_of_each_kernel(kernel, causal):
    """FLOPs as FlopCounterMode counts them and live bytes as the tracker sees them."""
    from torch.utils.flop_counter import FlopCounterMode

    from costmodel.single.attention import AttentionSpec, attention_estimate
    from validate.suites.attention import KERNELS, _inputs, measure_memory

    fn, family = KERNELS[kernel][0](), KERNELS[kernel][1]
    spec = AttentionSpec(batch=8, seq=80, head_dim=32, kernel=family, causal=causal)
    est = attention_estimate(spec)
    q, k, v = _inputs(80, 32, "fp32", torch.device("cpu"))
    if causal:
        measured = measure_memory(fn, q, k, v, torch.device("cpu"))
        assert measured["memory_bytes.after_forward"] == est["memory_bytes.after_forward"]
        # the CPU SDPA kernel's D = rowsum(dO ∘ O) is internal, not a tensor the tracker sees
        hidden = 4 * 8 * 80 if kernel == "sdpa" else 0
        assert measured["memory_bytes.peak"] == est["memory_bytes.peak"] - hidden
    if kernel == "flash-triton":
        return  # FlopCounterMode does not see inside Triton kernels
    with FlopCounterMode(display=False) as counter:
        out = fn(q, k, v, is_causal=causal)
        forward = counter.get_total_flops()
        out.sum().backward()
    assert forward == est["flops.forward"]
    assert counter.get_total_flops() - forward == est["flops.backward"]


def test_costmodel_flash_causal_work_and_io():
    from costmodel.single.attention import AttentionSpec, attention_estimate

    full = attention_estimate(AttentionSpec(batch=1, seq=1024, head_dim=64, tile=64))
    causal = attention_estimate(AttentionSpec(batch=1, seq=1024, head_dim=64, tile=64, causal=True))
    tiles = 1024 // 64
    assert causal["flops.forward"] == full["flops.forward"]  # as counted: dense
    assert causal["flops.forward_executed"] * 2 * tiles == full["flops.forward"] * (tiles + 1)
    # Dao et al. 2022, Thm 2: flash HBM traffic grows like N²d²/M, here N²d/B: quadrupling
    # N about quadruples the K/V re-reads once they dominate
    big = attention_estimate(AttentionSpec(batch=1, seq=4096, head_dim=64, tile=64))
    assert 3.5 < big["hbm_bytes.forward"] / full["hbm_bytes.forward"] < 16.5
    naive = attention_estimate(AttentionSpec(batch=1, seq=4096, head_dim=64, kernel="naive"))
    assert naive["hbm_bytes.forward"] > big["hbm_bytes.forward"]
