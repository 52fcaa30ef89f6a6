"""Collectives, send/recv and overlap on each placement, timed on every rank at once.

Each repetition starts after a barrier of every rank; every group of the placement runs its
collective at the same time (``validate.cluster.topology``). A rank times its own call (CUDA
events around an NCCL collective, whose stream the current one waits on; ``perf_counter``
with gloo); a repetition lasts as long as its slowest rank, and the record keeps the median
over repetitions. Sizes are the whole tensor (``costmodel.parallel.collectives``).

Overlap: on the largest placement, a chain of matmuls alone, an all-reduce alone, and the
all-reduce issued asynchronously with the same chain run while it is in flight; the share
of the shorter that hid (``fit.hidden_share``). The chain's length is set (by rank 0, for
all) to take about as long as the all-reduce.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from validate.cluster.fit import hidden_share, moved
from validate.cluster.store import MeasurementLog
from validate.cluster.topology import Placement, my_group
from validate.distributed.collectives import timed

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def sizes(device: torch.device, quick: bool) -> list[int]:
    """Message sizes in bytes, every factor of 4 from 64 KiB: up to 1 GiB on GPUs, 64 MiB
    on CPUs, 4 MiB with ``quick``."""
    top = 2**22 if quick else (2**30 if device.type == "cuda" else 2**26)
    return [2**k for k in range(16, top.bit_length(), 2)]


def _call(op: str, size: int, group: Any, device: torch.device) -> Callable[[], Any]:
    """The collective ``op`` on a ``size``-byte fp32 tensor in ``group``."""
    n = dist.get_world_size(group)
    count = max(n, size // 4 // n * n)
    x = torch.ones(count, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":
        part = torch.ones(count // n, device=device)
        return lambda: dist.all_gather_into_tensor(x, part, group=group)
    if op == "reduce_scatter":
        out = torch.empty(count // n, device=device)
        return lambda: dist.reduce_scatter_tensor(out, x, group=group)
    if op == "all_to_all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x, group=group)
    me = dist.get_group_rank(group, dist.get_rank())
    peer = dist.get_global_rank(group, me ^ 1) if (me ^ 1) < n else None
    if peer is None:  # the odd rank out of an odd group
        return lambda: None
    return (lambda: dist.send(x, peer)) if me % 2 == 0 else (lambda: dist.recv(x, peer))


def slowest_median(per_rank: list[list[float] | None]) -> float:
    """Median over repetitions of the slowest rank's seconds (ranks in no group: None)."""
    runs = [r for r in per_rank if r]
    return statistics.median(max(ts) for ts in zip(*runs, strict=True))


def _gather(value: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def measure_placement(
    log: MeasurementLog, place: Placement, device: torch.device, quick: bool, reps: int
) -> None:
    """Every op and size on ``place``, recorded as each finishes."""
    rank = dist.get_rank()
    group = my_group(place, rank)
    todo = [
        (op, s)
        for op in OPS
        for s in sizes(device, quick)
        if not log.has(f"net/{place.name}/{op}/{s}")
    ]
    for i, (op, size) in enumerate(todo, 1):
        mine = timed(_call(op, size, group, device), device, reps) if group else None
        seconds = slowest_median(_gather(mine))
        record = {
            "kind": "collective",
            "placement": place.name,
            "link": place.link,
            "n": place.size,
            "op": op,
            "size_bytes": size,
            "seconds": seconds,
            "busbw_Bps": moved(op, size, place.size) / seconds,
        }
        log.add(f"net/{place.name}/{op}/{size}", record)
        if rank == 0:
            print(
                f"[{place.name} {i}/{len(todo)}] {op} {size / 2**20:g} MiB: "
                f"{seconds * 1e3:.3f} ms, bus {record['busbw_Bps'] / 1e9:.2f} GB/s",
                file=sys.stderr,
                flush=True,
            )


def _chain(device: torch.device, dim: int) -> Callable[[int], None]:
    a = torch.randn(dim, dim, device=device)
    b = torch.randn(dim, dim, device=device)

    def run(times: int) -> None:
        for _ in range(times):
            torch.mm(a, b)

    return run


def measure_overlap(
    log: MeasurementLog, place: Placement, device: torch.device, quick: bool, reps: int
) -> None:
    """Compute alone, an all-reduce alone, both at once (module docstring)."""
    key = f"overlap/{place.name}"
    group = my_group(place, dist.get_rank())
    if log.has(key):
        return
    size = 2**22 if quick else 2**26
    x = torch.ones(size // 4, device=device)
    chain = _chain(device, 1024 if device.type == "cuda" else 256)
    comm_s = slowest_median(
        _gather(timed(lambda: dist.all_reduce(x, group=group), device, reps) if group else None)
    )
    one_s = slowest_median(_gather(timed(lambda: chain(1), device, reps)))
    count = [max(1, round(comm_s / one_s))]
    dist.broadcast_object_list(count, src=0)
    compute_s = slowest_median(_gather(timed(lambda: chain(count[0]), device, reps)))

    def both() -> None:
        work = dist.all_reduce(x, group=group, async_op=True) if group else None
        chain(count[0])
        if work is not None:
            work.wait()

    both_s = slowest_median(_gather(timed(both, device, reps)))
    hidden = hidden_share(compute_s, comm_s, both_s)
    log.add(
        key,
        {
            "kind": "overlap",
            "placement": place.name,
            "size_bytes": size,
            "compute_s": compute_s,
            "comm_s": comm_s,
            "both_s": both_s,
            "hidden": hidden,
        },
    )
    if dist.get_rank() == 0:
        print(
            f"[overlap {place.name}] compute {compute_s * 1e3:.2f} ms, all-reduce "
            f"{comm_s * 1e3:.2f} ms, both {both_s * 1e3:.2f} ms: {hidden:.0%} hidden",
            file=sys.stderr,
            flush=True,
        )
