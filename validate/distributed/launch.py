"""Process groups for the distributed checks: spawned on one machine, or under torchrun.

``launch(fn, world_size)`` starts ``world_size`` processes, each with
``torch.distributed`` initialised (gloo on CPU, NCCL with one GPU per rank), runs
``fn(rank, world_size, *args)`` and returns the per-rank results in rank order. A rank
that raises, dies (killed, out of memory) or hangs ends the launch with a clear error
within ``timeout_s`` of the ranks being ready (starting Python, importing torch and joining
the group have their own, longer ``STARTUP_S``, so a loaded machine does not turn a slow
start into a hang): the others are terminated, never waited on forever. A rank whose
parent dies (even by SIGKILL) removes the job folder and exits within a second, so no
rank process or temporary folder outlives its launch. Under
``torchrun`` (``RANK`` in the environment) ``run_distributed`` initialises from the
environment instead, so the same functions run across nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from costmodel.specs.hardware import Hardware

STARTUP_S = 300.0
"""Seconds ranks may take to start and join the group (python, torch import, rendezvous)."""


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def free_port() -> int:
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
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def threads_per_rank(world: int) -> int:
    """Intra-op threads each CPU rank runs: the machine's cores shared out."""
    return max(1, (os.cpu_count() or 1) // world)


def rank_hardware(hw: Hardware, world: int) -> Hardware:
    """The profile one of ``world`` CPU ranks sees: a CPU profile measures the whole machine
    (``validate.probes.calibrate`` runs on every core), and each rank computes on its
    :func:`threads_per_rank` of them and shares the memory bandwidth alike. Accelerators
    are one per rank: unchanged."""
    if hw.kind != "cpu":
        return hw
    share = min(1.0, threads_per_rank(world) / (os.cpu_count() or 1))
    return dataclasses.replace(
        hw,
        peak_flops={k: v and v * share for k, v in hw.peak_flops.items()},
        attention_flops={k: v * share for k, v in hw.attention_flops.items()},
        hbm_bw=hw.hbm_bw * share,
    )


def _worker_main(argv: list[str]) -> None:
    """One rank: ``python -m validate.distributed.launch JOB_DIR RANK WORLD BACKEND TIMEOUT``."""
    job, rank, world_size, backend, timeout_s = (
        Path(argv[0]), int(argv[1]), int(argv[2]), argv[3], float(argv[4]))  # fmt: skip
    torch.set_num_threads(threads_per_rank(world_size))
    _watch_parent(job)
    try:
        fn, args = _unpack((job / "job.pt").read_bytes())
        init(rank, world_size, backend, timeout_s)
        (job / f"{rank}.ready").write_text(str(os.getpid()))
        outcome = ("ok", fn(rank, world_size, *args))
    except BaseException:  # reported to the parent, which decides
        outcome = ("error", traceback.format_exc())
    part = job / f"{rank}.part"
    part.write_bytes(_pack(outcome))
    os.replace(part, job / f"{rank}.pt")  # the parent never reads half a result
    if outcome[0] == "ok":
        try:  # no rank tears down its group while another still communicates
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer died after its result: the parent has what it needs
            pass


def _watch_parent(job: Path) -> None:
    """A daemon thread: once this rank's parent is gone (it was killed), remove the job
    folder and exit, rather than wait on peers until the group's timeout."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        shutil.rmtree(job, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _ready_deadline(job: Path, n: int, start: float, timeout_s: float) -> float | None:
    """When the work must end: ``timeout_s`` after the last rank was ready; None while a
    rank is still starting (within ``STARTUP_S``)."""
    if all((job / f"{r}.ready").exists() or (job / f"{r}.pt").exists() for r in range(n)):
        return time.monotonic() + timeout_s
    if time.monotonic() - start > max(STARTUP_S, timeout_s):
        raise TimeoutError(f"ranks did not start within {max(STARTUP_S, timeout_s):.0f} s")
    return None


def _collect(procs: list[subprocess.Popen], job: Path, timeout_s: float) -> list[Any]:
    results: dict[int, Any] = {}
    start, deadline = time.monotonic(), None
    while len(results) < len(procs):
        if deadline is None:
            deadline = _ready_deadline(job, len(procs), start, timeout_s)
        for rank, proc in enumerate(procs):
            if rank not in results:
                done, value = result_of(job / f"{rank}.pt", rank, proc)
                if done:
                    results[rank] = value
        if len(results) < len(procs) and deadline is not None and time.monotonic() > deadline:
            missing = sorted(set(range(len(procs))) - set(results))
            raise TimeoutError(f"rank(s) {missing} did not finish within {timeout_s:.0f} s")
        time.sleep(0.05)
    return [results[r] for r in range(len(procs))]


def result_of(path: Path, rank: int, proc: Any) -> tuple[bool, Any]:
    """(True, its value) once ``path`` holds ``rank``'s result, (False, None) while it runs;
    a RuntimeError where it failed (its traceback) or its process ``proc`` died first."""
    if not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"rank {rank} died (exit code {proc.returncode})")
        return False, None
    status, value = _unpack(path.read_bytes())
    if status == "error":
        raise RuntimeError(f"rank {rank} failed:\n{value}")
    return True, value


def end_ranks(procs: list[Any]) -> None:
    """Wait up to 5 s for each rank to exit; kill those that have not."""
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    fresh: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new processes; results by rank.

    Ranks are ``python -m validate.distributed.launch`` subprocesses (not multiprocessing's
    spawn, which re-runs the parent's ``__main__`` in every child); ``fn`` must be
    importable (defined at a module's top level) and its results picklable; they come back
    by value. Inside ``pool.pooled()`` the job runs on ranks kept for the whole run instead
    (``validate.distributed.pool``), unless ``fresh``: a job measuring a rank's memory peaks
    runs in new processes, as a training run starts (the first TP step of a process holds
    251 KiB that a process which ran TP before does not), forked there from one that has
    imported torch (``validate.distributed.zygote``).
    """
    from validate.distributed import pool  # it builds on this module

    if pool.active():
        run = pool.run_fresh if fresh else pool.run
        return run(fn, world_size, args, backend, timeout_s)
    with tempfile.TemporaryDirectory(prefix="costmodel-dist-") as tmp:
        job = Path(tmp)
        (job / "job.pt").write_bytes(_pack((fn, args)))
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # fmt: skip
        cmd = [sys.executable, "-m", "validate.distributed.launch", tmp]
        procs = [subprocess.Popen([*cmd, str(r), str(world_size), backend, str(timeout_s)], env=env)
                 for r in range(world_size)]  # fmt: skip
        try:
            return _collect(procs, job, timeout_s)
        finally:
            end_ranks(procs)


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


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
