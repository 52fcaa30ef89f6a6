"""Process groups for the distributed checks: spawned on one machine, or under torchrun.

``launch(fn, world_size)`` starts ``world_size`` processes (spawn), each with
``torch.distributed`` initialised (gloo on CPU, NCCL with one GPU per rank), runs
``fn(rank, world_size, *args)`` and returns the per-rank results in rank order. A rank
that raises, dies (killed, out of memory) or hangs ends the launch with a clear error
within ``timeout_s``: the others are terminated, never waited on forever. Under
``torchrun`` (``RANK`` in the environment) ``run_distributed`` initialises from the
environment instead, so the same functions run across nodes.
"""

from __future__ import annotations

import io
import os
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, world_size: int, backend: str, timeout_s: float) -> torch.device:
    """Initialise the default group; returns this rank's device."""
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    return device


def _pack(value: Any) -> bytes:
    """Results by value: tensors sent through a queue by shared memory would need this
    process alive until the parent maps them, and it is about to exit."""
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank, world_size, port, backend, timeout_s, fn, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        init(rank, world_size, backend, timeout_s)
        queue.put((rank, "ok", _pack(fn(rank, world_size, *args))))
    except BaseException:  # reported to the parent, which decides
        queue.put((rank, "error", traceback.format_exc()))
        return
    try:  # no rank tears down its group while another still communicates
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # a peer died after its result: the parent has what it needs
        pass


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 120.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; results by rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, port, backend, timeout_s, fn, args, queue))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world_size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(results))
                raise TimeoutError(f"rank(s) {missing} did not finish within {timeout_s:.0f} s")
            try:
                rank, status, value = queue.get(timeout=0.2)
            except Exception:  # queue.Empty: check for dead ranks
                dead = [
                    (r, p.exitcode)
                    for r, p in enumerate(procs)
                    if r not in results and p.exitcode not in (None, 0)
                ]
                if dead:
                    raise RuntimeError(f"rank {dead[0][0]} died (exit code {dead[0][1]})") from None
                continue
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = _unpack(value)
    finally:
        for p in procs:
            p.join(timeout=5 if len(results) == world_size else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world_size)]


def run_distributed(fn: Callable[..., Any], *args: Any, timeout_s: float = 300.0) -> Any:
    """Under ``torchrun``: initialise from the environment, run ``fn`` on this rank."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = backend_for("cuda" if torch.cuda.is_available() else "cpu")
    init(rank, world_size, backend, timeout_s)
    try:
        result = fn(rank, world_size, *args)
        dist.barrier()  # no rank tears down while another still communicates
        return result
    finally:
        dist.destroy_process_group()
