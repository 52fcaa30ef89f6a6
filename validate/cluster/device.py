"""Each rank's device, measured on every rank at once (as a training step loads them).

- GEMMs: ``F.linear`` of a transformer layer's shapes (QKV, output, FFN up and down) over
  token counts from small to large, per dtype: the curve ``fit.gemm_rate`` fits;
- attention: causal ``scaled_dot_product_attention`` forward per dtype and sequence length,
  counted as costmodel's roofline counts a fused causal core (2·b·H·T²·d_h);
- memory bandwidth: a copy (one read, one write), as ``validate.probes.calibrate``;
- host seconds per kernel of an eager step (``validate.probes.calibrate.dispatch_seconds``).

A record keeps the median over ranks and the slowest rank's value (a straggler shows).
Timing: ``validate.probes.calibrate.time_call`` (CUDA events after warm-up on GPUs,
``torch.utils.benchmark`` on the rank's threads on CPUs).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from validate.cluster.store import MeasurementLog
from validate.probes.calibrate import dispatch_seconds, elementwise_bandwidth, time_call

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def gemm_shapes(device: torch.device, quick: bool) -> list[tuple[int, int, int]]:
    """(tokens, k, n2) of one layer's matmuls at several token counts."""
    if device.type == "cuda":
        d, counts = 4096, ((512, 4096) if quick else (128, 512, 2048, 8192))
    else:
        d, counts = (256, (64, 256)) if quick else (768, (64, 256, 1024))
    layer = [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)]
    return [(n, k, n2) for n in counts for k, n2 in layer]


def dtypes(device: torch.device) -> list[str]:
    """bf16 (and fp32) everywhere, fp16 too on GPUs; a CPU's fp16 is rarely fast and
    never what it trains in."""
    return ["fp32", "bf16", "fp16"] if device.type == "cuda" else ["fp32", "bf16"]


def _across_ranks(value: float) -> tuple[float, float]:
    """(median over ranks, slowest rank) of a per-rank number of seconds."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return statistics.median(out), max(out)


def _measure(
    log: MeasurementLog,
    key: str,
    fn: Callable[[], float],
    record: dict[str, Any],
    device: torch.device,
) -> None:
    """Time ``fn`` (it returns seconds) on every rank, record it once."""
    if log.has(key):
        return
    seconds, slowest = _across_ranks(fn())
    log.add(key, {**record, "seconds": seconds, "slowest_s": slowest})
    if dist.get_rank() == 0:
        print(
            f"[device] {key}: {seconds * 1e3:.3f} ms (slowest rank {slowest * 1e3:.3f})",
            file=sys.stderr,
            flush=True,
        )


def measure_gemms(log: MeasurementLog, device: torch.device, quick: bool) -> None:
    run_s = 0.05 if quick else 0.3
    for name in dtypes(device):
        dt = DTYPES[name]
        for n, k, n2 in gemm_shapes(device, quick):
            x = torch.randn(n, k, device=device, dtype=dt)
            w = torch.randn(n2, k, device=device, dtype=dt)
            _measure(
                log,
                f"gemm/{name}/{n}x{k}x{n2}",
                lambda x=x, w=w: time_call(lambda: F.linear(x, w), device, run_s),
                {"kind": "gemm", "dtype": name, "n": n, "k": k, "n2": n2},
                device,
            )


def measure_attention(log: MeasurementLog, device: torch.device, quick: bool) -> None:
    b, h, d = (4, 16, 128) if device.type == "cuda" else (1, 8, 64)
    seqs = (1024,) if quick else ((1024, 4096) if device.type == "cuda" else (256, 1024))
    seqs = (256,) if quick and device.type != "cuda" else seqs
    for name in ("fp32", "bf16"):
        for t in seqs:
            q, k, v = (torch.randn(b, h, t, d, device=device, dtype=DTYPES[name]) for _ in range(3))

            def run(q=q, k=k, v=v) -> float:
                call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                return time_call(call, device, 0.05 if quick else 0.3)

            _measure(
                log,
                f"attention/{name}/{t}",
                run,
                {"kind": "attention", "dtype": name, "flops": 2.0 * b * h * t * t * d},
                device,
            )


def measure_memory_and_host(log: MeasurementLog, device: torch.device, quick: bool) -> None:
    nbytes = 2**24 if quick else (2**30 if device.type == "cuda" else 2**28)
    _measure(
        log,
        "hbm/copy",
        lambda: 2 * nbytes / elementwise_bandwidth(device, nbytes)[1],
        {"kind": "hbm", "bytes": 2 * nbytes},
        device,
    )
    _measure(log, "host/dispatch", lambda: dispatch_seconds(device), {"kind": "dispatch"}, device)
