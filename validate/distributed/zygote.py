"""New rank processes without the start-up: a process that has imported torch forks each.

A job that measures a rank's memory must run in a new process, as a training run starts
(``launch.launch(..., fresh=True)``): a process that ran other jobs already holds what
their first steps allocated once. Started as ``python -m``, each rank pays Python's and
torch's start (7-8 s of an 8-9 s case on 2 cores). Inside ``pool.pooled()`` these ranks are
forked instead from one process kept for the run that has imported torch and nothing else
(no job run, no CUDA initialised, so a fork is as fresh as a new process for what a job
measures): each child runs ``launch._worker_main`` on the job's folder exactly as a new
process would and exits. The launcher watches the children through files the zygote
writes (``fork{k}.pid``, ``fork{k}.exit``), with ``launch``'s deadlines and errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from validate.distributed.launch import STARTUP_S, _watch_parent, _worker_main


class Zygote:
    """The forking process of one validation run (``pool.pooled`` closes it)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="costmodel-zygote-"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        cmd = [sys.executable, "-m", "validate.distributed.zygote", str(self.dir)]
        self.proc = subprocess.Popen(cmd, env=env)
        self.forks = 0

    def spawn(self, argv: list[str], env: dict[str, str]) -> ForkedRank:
        """A new rank running ``launch._worker_main(argv)`` with ``env`` set."""
        k, self.forks = self.forks, self.forks + 1
        part = self.dir / f"fork{k}.part"
        part.write_text(json.dumps({"argv": argv, "env": env}))
        os.replace(part, self.dir / f"fork{k}.json")
        start = time.monotonic()
        while not (self.dir / f"fork{k}.pid").exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the forking process died (exit code {self.proc.returncode})")
            if time.monotonic() - start > STARTUP_S:
                raise TimeoutError(f"the forking process did not start within {STARTUP_S:.0f} s")
            time.sleep(0.01)
        return ForkedRank(self.dir, k, int((self.dir / f"fork{k}.pid").read_text()))

    def close(self) -> None:
        (self.dir / "stop").touch()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class ForkedRank:
    """A forked rank as ``launch`` watches a ``subprocess.Popen``: ``poll``, ``returncode``,
    ``wait`` and ``kill``."""

    def __init__(self, folder: Path, k: int, pid: int) -> None:
        self.exit, self.pid, self.returncode = folder / f"fork{k}.exit", pid, None

    def poll(self) -> int | None:
        if self.returncode is None and self.exit.exists():
            self.returncode = int(self.exit.read_text() or 1)
        return self.returncode

    def wait(self, timeout: float) -> int:
        end = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.kill(self.pid, signal.SIGKILL)


def _zygote_main(folder: Path) -> None:
    """Import torch, then fork one child per request until told to stop, reaping them."""
    import torch  # noqa: F401  (the start-up each child skips)

    _watch_parent(folder)
    children: dict[int, int] = {}
    k = 0
    while not (folder / "stop").exists():
        request = folder / f"fork{k}.json"
        if request.exists():
            spec = json.loads(request.read_text())
            pid = os.fork()
            if pid == 0:  # the rank: a new process in all a job measures
                os.environ.update(spec["env"])
                code = 0
                try:
                    _worker_main(spec["argv"])
                except BaseException:  # _worker_main reports its own errors to the launcher
                    code = 1
                os._exit(code)
            children[pid] = k
            part = folder / f"fork{k}.pidpart"
            part.write_text(str(pid))
            os.replace(part, folder / f"fork{k}.pid")  # the launcher never reads half of it
            k += 1
        _reap(folder, children)
        time.sleep(0.005)
    for pid in children:
        os.kill(pid, signal.SIGKILL)


def _reap(folder: Path, children: dict[int, int]) -> None:
    """Write each finished child's exit status for its launcher."""
    for pid, k in list(children.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            part = folder / f"fork{k}.exitpart"
            part.write_text(str(code))
            os.replace(part, folder / f"fork{k}.exit")
            del children[pid]


def launch_forked(zygote: Zygote, fn: Any, world: int, args: tuple, backend: str,
                  timeout_s: float) -> list[Any]:  # fmt: skip
    """``launch.launch``'s job on ``world`` ranks forked from ``zygote``; results by rank."""
    from validate.distributed.launch import _collect, _pack, end_ranks, free_port

    with tempfile.TemporaryDirectory(prefix="costmodel-dist-") as tmp:
        job = Path(tmp)
        (job / "job.pt").write_bytes(_pack((fn, args)))
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        procs = [zygote.spawn([tmp, str(r), str(world), backend, str(timeout_s)], env)
                 for r in range(world)]  # fmt: skip
        try:
            return _collect(procs, job, timeout_s)  # type: ignore[arg-type]
        finally:
            end_ranks(procs)


if __name__ == "__main__":
    _zygote_main(Path(sys.argv[1]))
