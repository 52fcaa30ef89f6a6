"""Measure this machine: achievable matmul FLOP/s per dtype and memory bandwidth.

``python -m validate.calibrate --out profile.json`` writes a hardware profile that
``costmodel`` loads with ``--hardware profile.json``. CUDA: timed with CUDA events after
warm-up; CPU: ``torch.utils.benchmark`` (median of repeats). Link bandwidth and latency
keep placeholders until the collectives suite measures them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch
import torch.utils.benchmark as benchmark

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _time(fn, device: torch.device) -> float:
    """Median seconds per call."""
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
        return sorted(times)[len(times) // 2]
    return (
        benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median
    )


def matmul_flops(dtype: torch.dtype, device: torch.device, n: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _time(lambda: a @ b, device)


def memory_bandwidth(device: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / _time(lambda: dst.copy_(src), device)  # read + write


def profile(device: torch.device, n: int, nbytes: int) -> dict:
    peaks = {name: matmul_flops(dt, device, n) for name, dt in DTYPES.items()}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        peaks["tf32"] = matmul_flops(torch.float32, device, n)
        torch.backends.cuda.matmul.allow_tf32 = False
        name, capacity = (
            torch.cuda.get_device_name(device),
            torch.cuda.get_device_properties(device).total_memory,
        )
    else:
        name = f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"
        capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    bandwidth = memory_bandwidth(device, nbytes)
    return {
        "name": "measured",
        "kind": "gpu" if device.type == "cuda" else "cpu",
        "source": f"validate.calibrate on {name}, torch {torch.__version__}, {n}x{n} matmuls, "
        f"{nbytes / 2**20:.0f} MiB copy; achievable values, so efficiencies are 1",
        "peak_flops": {k: peaks.get(k) for k in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")},
        "hbm_bytes": capacity,
        "hbm_bw": bandwidth,
        "link_bw": bandwidth,
        "link_bw_bidir": 2 * bandwidth,
        "links_per_axis": 1,
        "devices_per_node": 1,
        "network_bw": bandwidth / 10,
        "link_latency_s": 2e-5,
        "network_latency_s": 1e-4,
        "efficiency": {"matmul": 1.0, "hbm": 1.0, "link": 1.0, "network": 1.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--size", type=int, default=None, help="matmul n (default 1024 CPU, 8192 GPU)"
    )
    parser.add_argument("--out", default="profile.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    n = args.size or (8192 if device.type == "cuda" else 1024)
    result = profile(device, n, 2**30 if device.type == "cuda" else 2**28)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(json.dumps(result["peak_flops"]), f"hbm_bw={result['hbm_bw']:.3e} B/s -> {args.out}")


if __name__ == "__main__":
    main()
