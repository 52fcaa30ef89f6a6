"""Measure this machine: achievable matmul FLOP/s per dtype, attention and memory bandwidth.

``python -m validate.calibrate --out profile.json`` writes a hardware profile that
``costmodel`` loads with ``--hardware profile.json``. Every number is what a framework op
achieves here, so the profile's efficiencies are 1 (matmul, hbm) or measured (attention):

- ``peak_flops[dtype]``: median FLOP/s of ``F.linear`` over the shapes a transformer runs
  (tokens x d -> 3d, 4d, d and the LM head), not a square-matmul best case;
- ``efficiency.attention``: causal ``scaled_dot_product_attention`` forward FLOP/s, counted
  as costmodel's roofline runs a fused causal core (the unmasked half, 2·b·H·T²·d_h), over
  the bf16 (GPU) or fp32 (CPU) matmul rate;
- ``hbm_bw``: bytes/s of an out-of-place elementwise op (``torch.add``: two reads, one
  write into a fresh tensor), as the model's norms, activations and residuals run; on CPU
  this includes the page faults of fresh allocations, which in-place copies do not see.

CPU runs re-execute under a caching allocator (``validate.cpu_env``). CUDA: CUDA events
after warm-up; CPU: ``torch.utils.benchmark`` on all intra-op threads
(its default is one thread). Link bandwidth and latency keep placeholders until the
collectives suite measures them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics

import torch
import torch.nn.functional as F
import torch.utils.benchmark as benchmark

from validate.cpu_env import reexec_with_caching_allocator

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def time_call(fn, device: torch.device, min_run_time: float = 0.3) -> float:
    """Median seconds per call of ``fn`` (warm)."""
    if device.type == "cuda":
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def linear_shapes(device: torch.device) -> list[tuple[int, int, int]]:
    """(tokens, in, out) of a transformer's matmuls at a size this device runs quickly."""
    tokens, d, vocab = (8192, 4096, 32768) if device.type == "cuda" else (1024, 768, 32768)
    return [
        (tokens, d, 3 * d),
        (tokens, d, d),
        (tokens, d, 4 * d),
        (tokens, 4 * d, d),
        (tokens, d, vocab),
    ]


def matmul_flops(dtype: torch.dtype, device: torch.device) -> float:
    """Median FLOP/s of ``F.linear`` over :func:`linear_shapes` (scaled down if slow)."""
    rates = []
    for n, k, n2 in linear_shapes(device):
        x = torch.randn(n, k, device=device, dtype=dtype)
        w = torch.randn(n2, k, device=device, dtype=dtype)
        seconds = time_call(lambda x=x, w=w: F.linear(x, w), device)
        rates.append(2 * n * k * n2 / seconds)
        if seconds > 1.0:  # a dtype without fast kernels (fp16 on most CPUs): one shape is enough
            break
    return statistics.median(rates)


def attention_flops(dtype: torch.dtype, device: torch.device) -> float:
    b, h, t, d = (8, 32, 4096, 128) if device.type == "cuda" else (1, 12, 1024, 64)
    q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dtype) for _ in range(3))
    seconds = time_call(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device)
    return 2 * b * h * t * t * d / seconds


def elementwise_bandwidth(device: torch.device, nbytes: int) -> tuple[float, float]:
    """(out-of-place add, in-place copy) bytes/s."""
    x = torch.ones(nbytes // 4, device=device)
    y = torch.empty_like(x)
    add = 3 * nbytes / time_call(lambda: torch.add(x, x), device)
    copy = 2 * nbytes / time_call(lambda: y.copy_(x), device)
    return add, copy


def _machine(device: torch.device) -> tuple[str, int]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.name, props.total_memory
    name = f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
    return name, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def profile(device: torch.device, nbytes: int) -> dict:
    """A costmodel hardware profile of ``device``, every rate measured here."""
    peaks = {name: matmul_flops(dt, device) for name, dt in DTYPES.items()}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        peaks["tf32"] = matmul_flops(torch.float32, device)
        torch.backends.cuda.matmul.allow_tf32 = False
    attn_dtype = "bf16" if device.type == "cuda" else "fp32"
    attention = attention_flops(DTYPES[attn_dtype], device)
    add_bw, copy_bw = elementwise_bandwidth(device, nbytes)
    name, capacity = _machine(device)
    return {
        "name": "measured",
        "kind": "gpu" if device.type == "cuda" else "cpu",
        "source": f"validate.calibrate on {name}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; F.linear medians over transformer shapes, "
        f"causal SDPA, {nbytes / 2**20:.0f} MiB elementwise add",
        "peak_flops": {k: peaks.get(k) for k in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")},
        "hbm_bytes": capacity,
        "hbm_bw": add_bw,
        "link_bw": copy_bw,
        "link_bw_bidir": 2 * copy_bw,
        "links_per_axis": 1,
        "devices_per_node": 1,
        "network_bw": copy_bw / 10,
        "link_latency_s": 2e-5,
        "network_latency_s": 1e-4,
        "efficiency": {
            "matmul": 1.0,
            "attention": min(1.0, attention / peaks[attn_dtype]),
            "hbm": 1.0,
            "link": 1.0,
            "network": 1.0,
        },
        "measured": {
            "attention_flops": attention,
            "attention_dtype": attn_dtype,
            "copy_bw": copy_bw,
            "add_bw": add_bw,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="profile.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    result = profile(device, 2**30 if device.type == "cuda" else 2**28)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    flops = {k: f"{v:.3e}" for k, v in result["peak_flops"].items() if v}
    print(
        f"peak_flops {flops} hbm_bw={result['hbm_bw']:.3e} B/s "
        f"attention eff={result['efficiency']['attention']:.2f} -> {args.out}"
    )


if __name__ == "__main__":
    reexec_with_caching_allocator("validate.calibrate")
    main()
