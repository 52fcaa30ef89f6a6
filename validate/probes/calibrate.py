"""Measure this machine: achievable matmul FLOP/s per dtype, attention and memory bandwidth.

``python -m validate.probes.calibrate --out profile.json`` writes a hardware profile that
``costmodel`` loads with ``--hardware profile.json``. Every number is what a framework op
achieves here, so the profile's efficiencies are 1 (matmul, hbm) or measured (attention):

- ``peak_flops[dtype]``: FLOP/s of one transformer layer's chain of ``F.linear`` calls
  (tokens x d -> 3d, d, 4d, 4d -> d and an LM head; median over token counts), not a
  square-matmul best case;
- ``attention_flops[dtype]``: causal ``scaled_dot_product_attention`` forward FLOP/s in fp32
  and bf16, counted as costmodel's roofline runs a fused causal core (the unmasked half,
  2·b·H·T²·d_h); ``efficiency.attention`` is the bf16 (GPU) or fp32 (CPU) one over that
  dtype's matmul rate, for readers of the profile;
- ``dispatch_s``: host seconds per kernel of an eager training step: forward and backward
  of a reference model too small for its kernels' own work to matter (2 layers, d 32,
  8 tokens), over the kernels ``costmodel.single.kernels`` counts for it;
- ``hbm_bw``: bytes/s of a copy (STREAM's Copy: one read, one write), best of repeats;
  ``measured.add_bw`` is an out-of-place add for comparison. Both run under the caching
  allocator of ``validate.probes.cpu_env`` (jemalloc when installed): without it a fresh 256 MiB
  output costs page faults and the add reads ~8 GB/s instead of ~40 GB/s here.

CPU runs re-execute under a caching allocator (``validate.probes.cpu_env``). CUDA: CUDA events
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
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import torch.utils.benchmark as benchmark

from validate.probes.cpu_env import active_allocator, reexec_with_caching_allocator

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


SLOW_CALL_S = 0.5
"""A matmul chain's call this long is timed once, and the next token counts are skipped."""


def layer_shapes(device: torch.device) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """Token counts and the (in, out) of one layer's matmuls plus an LM head."""
    cuda = device.type == "cuda"
    counts, d, vocab = ((2048, 8192), 4096, 32768) if cuda else ((256, 512, 1024), 768, 32768)
    return counts, [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d), (d, vocab)]


def matmul_flops(dtype: torch.dtype, device: torch.device) -> float:
    """Median over token counts of the FLOP/s of one layer's ``F.linear`` chain.

    The chain (QKV, output, FFN up and down, LM head) runs as a model runs them, each
    weight evicted from cache by the others, rather than one shape repeated hot, which on
    CPUs reads up to 25 % faster than the same shapes inside a model.
    """
    counts, shapes = layer_shapes(device)
    rates = []
    for n in counts:
        xs = {k: torch.randn(n, k, device=device, dtype=dtype) for k, _ in shapes}
        ws = [torch.randn(out, k, device=device, dtype=dtype) for k, out in shapes]

        def chain(xs=xs, ws=ws) -> None:
            for w in ws:
                F.linear(xs[w.shape[1]], w)

        seconds = _chain_seconds(chain, device)
        rates.append(2 * n * sum(k * out for k, out in shapes) / seconds)
        if seconds > SLOW_CALL_S:  # a dtype without fast kernels (fp16 on most CPUs): enough
            break
    return statistics.median(rates)


def _chain_seconds(chain: Callable[[], None], device: torch.device) -> float:
    """Seconds of one call of ``chain``: the smaller of two timed runs (load only slows);
    on a CPU, one warm call where it takes over ``SLOW_CALL_S`` (a dtype emulated without
    native kernels, bf16 or fp16 on most CPUs: a precise enough rate, where timing them
    again and again took 22 of a 40 s calibration)."""
    if device.type != "cuda":
        chain()  # warm
        start = time.perf_counter()
        chain()
        once = time.perf_counter() - start
        if once > SLOW_CALL_S:
            return once
    return min(time_call(chain, device) for _ in range(2))


def attention_flops(dtype: torch.dtype, device: torch.device) -> float:
    """Median over sequence lengths of causal SDPA forward FLOP/s (causal half counted)."""
    b, h, d, seqs = (
        (8, 32, 128, (1024, 4096)) if device.type == "cuda" else (1, 12, 64, (256, 1024))
    )
    rates = []
    for t in seqs:
        q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dtype) for _ in range(3))
        seconds = min(
            time_call(
                lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                device,
            )
            for _ in range(2)
        )
        rates.append(2 * b * h * t * t * d / seconds)
    return statistics.median(rates)


def elementwise_bandwidth(device: torch.device, nbytes: int) -> tuple[float, float]:
    """(out-of-place add, in-place copy) bytes/s."""
    x = torch.ones(nbytes // 4, device=device)
    y = torch.empty_like(x)
    add = 3 * nbytes / min(time_call(lambda: torch.add(x, x), device) for _ in range(2))
    copy = 2 * nbytes / min(time_call(lambda: y.copy_(x), device) for _ in range(2))
    return add, copy


def dispatch_seconds(device: torch.device) -> float:
    """Host seconds per dispatched kernel (module docstring)."""
    from costmodel import ModelSpec, TrainSpec
    from costmodel.single.kernels import counted, layer_kernels, model_kernels
    from validate.reference.model import TransformerLM, make_batch

    spec = ModelSpec(vocab=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_positions=8)
    train = TrainSpec(batch=1, seq=8, precision="fp32", elementwise="eager")
    model = TransformerLM.for_training(spec, train, device=device)
    batch = make_batch(model, 1, 8, device)

    def step() -> None:
        model(batch).backward()

    layer, outside = (counted(k(spec, train, 4), spec) for k in (layer_kernels, model_kernels))
    kernels = sum(spec.n_layers * n + k for n, k in zip(layer, outside, strict=True))
    return min(time_call(step, device) for _ in range(3)) / kernels


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
    attention = {k: attention_flops(DTYPES[k], device) for k in ("fp32", "bf16")}
    attn_dtype = "bf16" if device.type == "cuda" else "fp32"
    add_bw, copy_bw = elementwise_bandwidth(device, nbytes)
    dispatch = dispatch_seconds(device)
    name, capacity = _machine(device)
    return {
        "name": "measured",
        "kind": "gpu" if device.type == "cuda" else "cpu",
        "source": f"validate.probes.calibrate on {name}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; F.linear layer chains, "
        f"causal SDPA, {nbytes / 2**20:.0f} MiB copy, a tiny model's eager step per kernel",
        "calibration": {
            "basis": "measured",
            "summary": f"measured on {name} by python -m validate.probes.calibrate (device "
            "rates; the network is not measured: a copy-bandwidth stand-in)",
        },
        "peak_flops": {k: peaks.get(k) for k in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")},
        "hbm_bytes": capacity,
        "hbm_bw": copy_bw,
        "link_bw": copy_bw,
        "link_bw_bidir": 2 * copy_bw,
        "links_per_axis": 1,
        "devices_per_node": 1,
        "network_bw": copy_bw / 10,
        "link_latency_s": 2e-5,
        "network_latency_s": 1e-4,
        "efficiency": {
            "matmul": 1.0,
            "attention": min(1.0, attention[attn_dtype] / peaks[attn_dtype]),
            "hbm": 1.0,
            "link": 1.0,
            "network": 1.0,
        },
        "attention_flops": attention,
        "dispatch_s": dispatch,
        "measured": {"copy_bw": copy_bw, "add_bw": add_bw, "allocator": active_allocator()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
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
        f"attention eff={result['efficiency']['attention']:.2f} "
        f"dispatch={result['dispatch_s'] * 1e6:.1f} us/kernel -> {args.out}"
    )


if __name__ == "__main__":
    reexec_with_caching_allocator("validate.probes.calibrate")
    main()
