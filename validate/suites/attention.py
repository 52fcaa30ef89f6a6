"""The attention suite: each kernel's time and memory against ``costmodel.single.attention``.

Cases: sequence length x head dim x kernel x dtype, causal, batch 8 and one head (the
CS336 benchmark's shapes), forward and backward. Time: ``triton.testing.do_bench`` on
GPU, ``torch.utils.benchmark`` on CPU (all threads). Memory: on GPU
``max_memory_allocated`` and ``memory_allocated`` around the call; on CPU the live-tensor
tracker of ``validate.probes.accounting`` (inputs included; memory inside a C++ kernel that is
not a tensor is invisible to it). A case whose predicted peak does not fit is an ``oom``
row without running; a real OOM is one too. On CPU the Triton kernel runs interpreted, so
it is checked for correctness (max abs error against naive attention), not timed; the
tiled PyTorch FlashAttention is the algorithm's reference and is checked the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
import torch.utils.benchmark as benchmark

from costmodel.single.attention import AttentionSpec, attention_estimate, attention_time
from validate.probes.accounting import StorageTracker
from validate.reference.attention import (
    FlashAttentionPytorch,
    compiled_naive_attention,
    naive_attention,
    sdpa_attention,
)
from validate.report.results import Row
from validate.suites.runner import Case, Context, free_bytes

SUITE = "attention"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BATCH, HEADS = 8, 1


def _triton():
    from validate.reference.attention.flash_triton import FlashAttentionTriton

    return FlashAttentionTriton.apply


KERNELS = {  # name -> (function factory, costmodel kernel)
    "naive": (lambda: naive_attention, "naive"),
    "naive-compiled": (lambda: compiled_naive_attention, "naive"),
    "sdpa": (lambda: sdpa_attention, "flash"),
    "flash-triton": (_triton, "flash"),
}


def grid(device: torch.device, quick: bool) -> list[tuple[int, int, str, str]]:
    """(seq, head_dim, kernel, dtype) cases that are timed and measured."""
    cuda = device.type == "cuda"
    if quick:  # a naive kernel at 4,096 took 17 s of a 2-core CPU: the full grid's
        seqs, dims = (256, 1024, 4096) if cuda else (256, 1024), (16, 64)
    else:
        seqs, dims = (256, 1024, 4096, 16384), (16, 32, 64, 128)
    if cuda and not quick:
        seqs = (*seqs, 32768, 65536)
    kernels = list(KERNELS) if cuda else ["naive", "naive-compiled", "sdpa"]
    dtypes = ("fp32", "bf16") if cuda or not quick else ("fp32",)
    if quick and not cuda:
        kernels = ["naive", "sdpa"]
    return list(itertools.product(seqs, dims, kernels, dtypes))


def _timer(fn, device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn) / 1e3
    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=0.2).median


def _inputs(seq: int, dim: int, dtype: str, device: torch.device):
    torch.manual_seed(0)
    shape = (BATCH, HEADS, seq, dim)
    return [
        torch.randn(shape, device=device, dtype=DTYPES[dtype], requires_grad=True) for _ in "qkv"
    ]


def measure_memory(fn, q, k, v, device: torch.device) -> dict[str, int]:
    """Bytes live after forward and the peak through backward, inputs included; after one
    forward and backward that are not measured: Triton's autotuner times its configurations
    on the first call (``do_bench`` allocates a 256 MiB buffer to flush the L2 cache) and
    ``torch.compile`` compiles, which put 257 MiB and 51 MiB under small kernels' peaks on
    an H100 before."""
    fn(q, k, v, is_causal=True).sum().backward()
    for t in (q, k, v):
        t.grad = None
    inputs = sum(t.untyped_storage().nbytes() for t in (q, k, v))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device) - inputs
        torch.cuda.reset_peak_memory_stats(device)
        out = fn(q, k, v, is_causal=True)
        after = torch.cuda.memory_allocated(device) - base
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        tracker = StorageTracker({t.untyped_storage()._cdata for t in (q, k, v)}, track_peak=True)
        with tracker:
            out = fn(q, k, v, is_causal=True)
            after = inputs + tracker.live_bytes()
            out.backward(torch.randn_like(out))
        peak = inputs + tracker.peak_bytes
    for t in (q, k, v):
        t.grad = None
    return {"memory_bytes.after_forward": after, "memory_bytes.peak": peak}


def measure_time(fn, q, k, v, device: torch.device) -> dict[str, float]:
    """Forward seconds, and backward as (forward + backward) − forward: each repetition
    builds its own graph and runs backward once, as training does (a compiled backward
    frees what it saved, so one graph cannot be timed twice)."""
    forward = _timer(lambda: fn(q, k, v, is_causal=True), device)
    grad = torch.randn_like(fn(q, k, v, is_causal=True))
    both = _timer(lambda: torch.autograd.grad(fn(q, k, v, is_causal=True), (q, k, v), grad), device)
    return {"time_s.forward": forward, "time_s.backward": max(both - forward, 0.0)}


def run(seq: int, dim: int, kernel: str, dtype: str, ctx: Context) -> Iterator[Row]:
    name = f"{kernel}/{dtype}/seq{seq}/d{dim}"
    spec = AttentionSpec(batch=BATCH, heads=HEADS, seq=seq, head_dim=dim,
                         kernel=KERNELS[kernel][1], dtype=dtype, causal=True)  # fmt: skip
    predicted = {**attention_estimate(spec), **attention_time(spec, ctx.hardware)}
    config = {"seq": seq, "head_dim": dim, "kernel": kernel, "dtype": dtype, "batch": BATCH}

    def row(quantity, measured, unit, status="ok", **extra) -> Row:
        return Row(SUITE, name, quantity, predicted.get(quantity), measured, ctx.label, status,
                   unit, {"config": config, **extra})  # fmt: skip

    if predicted["memory_bytes.peak"] > 0.8 * free_bytes(ctx.device):
        yield row("memory_bytes.peak", None, "bytes", "oom", message="predicted peak does not fit")
        return
    fn = KERNELS[kernel][0]()
    q, k, v = _inputs(seq, dim, dtype, ctx.device)
    for quantity, value in measure_memory(fn, q, k, v, ctx.device).items():
        yield row(quantity, value, "bytes")
    for quantity, value in measure_time(fn, q, k, v, ctx.device).items():
        yield row(quantity, value, "s")


def correctness(kernel: str, ctx: Context) -> Iterator[Row]:
    """Max abs error of output and gradients against fp64 naive attention (odd length)."""
    fn = FlashAttentionPytorch.apply if kernel == "flash-pytorch" else _triton()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 75, 32, device=ctx.device, requires_grad=True) for _ in "qkv")
    out = fn(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = naive_attention(*ref_in, is_causal=True)
    want = (ref, *torch.autograd.grad(ref, ref_in, grad.double()))
    tolerance = 5e-3 if ctx.device.type == "cuda" else 1e-5  # TF32 matmuls on GPU
    for label, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        err = (a.double() - b).abs().max().item()
        status = "ok" if err <= tolerance else "error"
        yield Row(SUITE, f"{kernel}/correctness", f"max_abs_error.{label}", None, err,
                  ctx.label, status, "abs", {"tolerance": tolerance})  # fmt: skip


def cases(ctx: Context) -> list[Case]:
    out = [
        Case(SUITE, f"{kern}/correctness", lambda ctx, kern=kern: correctness(kern, ctx))
        for kern in ("flash-pytorch", "flash-triton")
    ]
    for seq, dim, kernel, dtype in grid(ctx.device, ctx.quick):
        out.append(Case(SUITE, f"{kernel}/{dtype}/seq{seq}/d{dim}",
                        lambda ctx, a=(seq, dim, kernel, dtype): run(*a, ctx)))  # fmt: skip
    return out
