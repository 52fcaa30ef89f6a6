"""Ranks kept for a whole validation run: one process group per (world size, backend),
started once and handed one job after another.

Each case of the distributed suites used to start its own ranks (``launch.launch``): on a
2-core machine, two Python processes importing torch and joining a group took 7-8 s of a
case's 8-9 s. Inside :func:`pooled` (``python -m validate.run`` wraps its suites in it),
``launch.launch`` hands ``fn`` to a pool's ranks instead; they run it, write their results
and meet at a barrier before the next job. What a job measures is unchanged: memory is read
as live bytes from a job's start (``memory.LiveBytes``), times within the job, and every
job builds its model, optimizer and groups anew.

Memory jobs (``fresh``) run on new ranks forked from a process that has imported torch
(``validate.distributed.zygote``), which the run keeps too.

A job that raises on any rank, a rank that dies and a job past its timeout end the pool
(its ranks are killed; a later job starts a new one), so a broken group never runs another
job. Ranks whose parent dies remove the pool's folder and exit, as ``launch``'s do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from validate.distributed.launch import (
    STARTUP_S,
    _pack,
    _unpack,
    _watch_parent,
    free_port,
    init,
    result_of,
    threads_per_rank,
)
from validate.distributed.zygote import Zygote, launch_forked

_POOLS: dict[tuple[int, str], RankPool] = {}
_ZYGOTE: list[Zygote] = []
_ACTIVE = [False]


@contextmanager
def pooled() -> Iterator[None]:
    """Within it, ``launch.launch`` runs its jobs on kept ranks; they end with it."""
    before = _ACTIVE[0]
    _ACTIVE[0] = True
    try:
        yield
    finally:
        _ACTIVE[0] = before
        if not before:
            for pool in list(_POOLS.values()):
                pool.close()
            _POOLS.clear()
            for zygote in _ZYGOTE:
                zygote.close()
            _ZYGOTE.clear()


def active() -> bool:
    return _ACTIVE[0]


def run(fn: Callable[..., Any], world: int, args: tuple, backend: str, timeout_s: float) -> list:
    """``fn(rank, world, *args)`` on the kept ranks of (``world``, ``backend``), started
    here if none are; results by rank. A failure ends that pool and is raised."""
    key = (world, backend)
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = RankPool(world, backend, timeout_s)
    try:
        return pool.run(fn, args, timeout_s)
    except BaseException:
        pool.close()
        _POOLS.pop(key, None)
        raise


def run_fresh(
    fn: Callable[..., Any], world: int, args: tuple, backend: str, timeout_s: float
) -> list:
    """``fn(rank, world, *args)`` on new ranks forked from the run's zygote (started here
    if none is: ``validate.distributed.zygote``); results by rank."""
    if not _ZYGOTE:
        _ZYGOTE.append(Zygote())
    return launch_forked(_ZYGOTE[0], fn, world, args, backend, timeout_s)


class RankPool:
    """``world`` rank processes in one group, each running the jobs written to its folder
    in order (``job{k}.pt``) and answering ``job{k}-{rank}.pt``."""

    def __init__(self, world: int, backend: str, timeout_s: float) -> None:
        self.world, self.jobs = world, 0
        self.dir = Path(tempfile.mkdtemp(prefix="costmodel-pool-"))
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # fmt: skip
        cmd = [sys.executable, "-m", "validate.distributed.pool", str(self.dir)]
        self.procs = [subprocess.Popen([*cmd, str(r), str(world), backend, str(timeout_s)],
                                       env=env) for r in range(world)]  # fmt: skip

    def run(self, fn: Callable[..., Any], args: tuple, timeout_s: float) -> list:
        k, self.jobs = self.jobs, self.jobs + 1
        part = self.dir / f"job{k}.part"
        part.write_bytes(_pack((fn, args)))
        os.replace(part, self.dir / f"job{k}.pt")
        start = time.monotonic()
        started = k > 0  # the first job also waits for the ranks to start
        results: dict[int, Any] = {}
        while len(results) < self.world:
            if not started:
                started = all((self.dir / f"{r}.ready").exists() for r in range(self.world))
                if started:
                    start = time.monotonic()
                elif time.monotonic() - start > max(STARTUP_S, timeout_s):
                    raise TimeoutError(f"ranks did not start within {STARTUP_S:.0f} s")
            for rank, proc in enumerate(self.procs):
                if rank not in results:
                    done, value = result_of(self.dir / f"job{k}-{rank}.pt", rank, proc)
                    if done:
                        results[rank] = value
            if started and len(results) < self.world and time.monotonic() - start > timeout_s:
                missing = sorted(set(range(self.world)) - set(results))
                raise TimeoutError(f"rank(s) {missing} did not finish within {timeout_s:.0f} s")
            time.sleep(0.02)
        return [results[r] for r in range(self.world)]

    def close(self) -> None:
        """Ask the ranks to leave, kill what has not within 5 s, remove the folder."""
        (self.dir / "stop").touch()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _worker_main(argv: list[str]) -> None:
    """One kept rank: ``python -m validate.distributed.pool DIR RANK WORLD BACKEND TIMEOUT``."""
    folder, rank, world = Path(argv[0]), int(argv[1]), int(argv[2])
    backend, timeout_s = argv[3], float(argv[4])
    torch.set_num_threads(threads_per_rank(world))
    _watch_parent(folder)
    init(rank, world, backend, timeout_s)
    (folder / f"{rank}.ready").write_text(str(os.getpid()))
    k = 0
    while True:
        job = folder / f"job{k}.pt"
        while not job.exists() and not (folder / "stop").exists():
            time.sleep(0.01)
        if not job.exists():
            break
        try:
            fn, args = _unpack(job.read_bytes())
            outcome = ("ok", fn(rank, world, *args))
        except BaseException:  # reported to the parent, which ends the pool
            outcome = ("error", traceback.format_exc())
        part = folder / f"job{k}-{rank}.part"
        part.write_bytes(_pack(outcome))
        os.replace(part, folder / f"job{k}-{rank}.pt")
        if outcome[0] == "error":
            os._exit(1)  # the group may be broken: never run another job on it
        dist.barrier()  # every rank done with this job before any starts the next
        k += 1
    with contextlib.suppress(Exception):  # a peer left first: nothing more to tear down
        dist.destroy_process_group()


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
