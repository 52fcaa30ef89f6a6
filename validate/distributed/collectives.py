"""Collective benchmarks on torch.distributed and the α-β fit of this machine's links.

``bench`` runs on every rank: for each collective and size, warm-up, then repetitions, each
started after a barrier and timed locally (CUDA events with NCCL, ``perf_counter`` with
gloo). The parent takes, per repetition, the slowest rank (a collective ends when its last
rank does) and the median over repetitions. ``fit_alpha_beta`` solves the least-squares
fit of T = steps·α + bytes_per_rank/β (``costmodel.parallel.collectives``) over all measurements,
and ``write_link_profile`` puts it into a hardware profile.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from costmodel.parallel.collectives import OPS, bytes_per_rank, ring_steps

__all__ = [
    "OPS",
    "aggregate",
    "bench",
    "fit_alpha_beta",
    "solve_alpha_beta",
    "timed",
    "write_link_profile",
]


def _run(op: str, size: int, world: int, device: torch.device):
    n = size // 4
    if op == "all_reduce":
        x = torch.ones(n, device=device)
        return lambda: dist.all_reduce(x)
    if op == "all_gather":
        x, out = torch.ones(n // world, device=device), torch.empty(n, device=device)
        return lambda: dist.all_gather_into_tensor(out, x)
    if op == "reduce_scatter":
        x, out = torch.ones(n, device=device), torch.empty(n // world, device=device)
        return lambda: dist.reduce_scatter_tensor(out, x)
    if op == "all_to_all":  # each rank's n elements, n / world to every rank
        x, out = torch.ones(n, device=device), torch.empty(n, device=device)
        return lambda: dist.all_to_all_single(out, x)
    x = torch.ones(n, device=device)
    return lambda: dist.broadcast(x, src=0)


def bench(rank: int, world: int, sizes: list[int], reps: int, ops: tuple[str, ...] = OPS) -> list:
    """[(op, size_bytes, [seconds per repetition])] measured on this rank."""
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available() and (dist.get_backend() == "nccl")
        else torch.device("cpu")
    )
    out = []
    for op in ops:
        for size in sizes:
            fn = _run(op, size - size % (4 * world), world, device)
            times = timed(fn, device, reps)
            out.append((op, size, times))
    return out


def timed(fn: Any, device: torch.device, reps: int, warmup: int = 2) -> list[float]:
    """Seconds of ``fn`` on this rank per repetition, each started after a barrier of every
    rank (CUDA events around an NCCL call, whose stream the current one waits on;
    ``perf_counter`` with gloo)."""
    for _ in range(warmup):  # connections, allocations
        fn()
    out = []
    for _ in range(reps):
        dist.barrier()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return out


def aggregate(per_rank: list[list], world: int) -> list[dict[str, Any]]:
    """Slowest rank per repetition, median over repetitions; algorithm and bus bandwidth."""
    rows = []
    for entries in zip(*per_rank, strict=True):
        op, size = entries[0][0], entries[0][1]
        slowest = [max(ts) for ts in zip(*(e[2] for e in entries), strict=True)]
        seconds = statistics.median(slowest)
        rows.append(
            {
                "op": op,
                "size_bytes": size,
                "world": world,
                "seconds": seconds,
                "algbw": size / seconds,
                "busbw": bytes_per_rank(op, size, world) / seconds,
            }
        )
    return rows


def fit_alpha_beta(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(α seconds, β bytes/s) minimising squared relative error of T = steps·α + B/β."""
    rounds = [ring_steps(r["op"], r["world"]) for r in rows]
    moved = [bytes_per_rank(r["op"], r["size_bytes"], r["world"]) for r in rows]
    return solve_alpha_beta(rounds, moved, [r["seconds"] for r in rows])


def solve_alpha_beta(rounds: Any, moved: Any, seconds: Any) -> tuple[float, float]:
    """(α, β) of T = rounds·α + moved/β, least squares in relative error (every size
    counts the same); α pinned at 0 where the free fit makes it negative."""
    a = np.column_stack([rounds, moved]).astype(float)
    t = np.asarray(seconds, dtype=float)
    a, ones = a / t[:, None], np.ones_like(t)
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, ones, rcond=None)
    if alpha < 0 or inv_beta <= 0:  # non-negative least squares: pin one, refit the other
        alpha, inv_beta = 0.0, float(a[:, 1] @ ones / (a[:, 1] @ a[:, 1]))
    if inv_beta <= 0:
        raise ValueError("the fit gave a non-positive 1/β: measurements too noisy to fit")
    return float(alpha), 1.0 / float(inv_beta)


def write_link_profile(path: Path, alpha: float, beta: float, backend: str) -> None:
    """Put the fitted α and β into a hardware profile (every link of this machine)."""
    profile = json.loads(path.read_text())
    profile.update(
        link_latency_s=alpha,
        network_latency_s=alpha,
        link_bw=beta,
        link_bw_bidir=2 * beta,
        network_bw=beta,
    )
    profile.setdefault("measured", {})["collectives"] = {
        "alpha_s": alpha,
        "beta_Bps": beta,
        "backend": backend,
    }
    path.write_text(json.dumps(profile, indent=2))
