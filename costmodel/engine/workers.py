"""Compile a search's structures in parallel: worker processes, one per core, each building
and printing its share of the structures that are not on disk yet into the disk cache
(:mod:`costmodel.engine.diskcache`), from which the search then loads them.

Building one structure's expressions and printing their function is pure-Python sympy
(0.2-0.3 s each, on one core); a cold search over 1,024 GPUs meets 48 of them. The workers
are ``python -m costmodel.engine.workers`` (not ``multiprocessing``, whose spawned children
re-import the caller's ``__main__``, e.g. the CLI's), read the structures as JSON lines and
report one line per structure done (the caller's progress bar). ``COSTMODEL_WORKERS=N``
caps them (1: compile in this process); without a disk cache, or with fewer than
``PER_WORKER`` structures a worker, the search compiles in its own process. A worker that
fails leaves its structures to the caller, which compiles what is still missing itself.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from costmodel.engine.diskcache import cache_dir
from costmodel.engine.quantities import compiled_subset, is_compiled

PER_WORKER = 4
"""Structures a worker must have to pay for its start (importing sympy and costmodel,
~0.5 s, about two structures' compile)."""


def cores() -> int:
    """The cores this process may use, at most ``COSTMODEL_WORKERS`` when set."""
    setting = os.environ.get("COSTMODEL_WORKERS", "")
    found = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return int(setting) if setting.isdigit() and int(setting) > 0 else found or 1


def workers_for(pending: int) -> int:
    """Worker processes for ``pending`` structures: one per core (``COSTMODEL_WORKERS`` caps
    it), at least ``PER_WORKER`` structures each; 1: compile in this process."""
    if cache_dir() is None:
        return 1
    return max(1, min(cores(), pending // PER_WORKER))


def compile_all(
    structures: list[tuple], keys: tuple[str, ...],
    progress: Callable[[Iterable[Any], int], Iterable[Any]] | None = None,
) -> None:  # fmt: skip
    """Every structure's ``keys`` compiled (``quantities.compiled_subset``), those missing
    from the disk cache by workers when there are enough of them, with progress."""
    pending = [s for s in structures if not is_compiled(s, keys)]
    count = workers_for(len(pending))
    if count > 1:
        done = _in_workers(pending, keys, count)
        for _ in progress(done, len(pending)) if progress else done:
            pass
        progress = None  # the rest loads (what a failed worker left is compiled here)
    for structure in progress(structures, len(structures)) if progress else structures:
        compiled_subset(structure, keys)


def _in_workers(pending: list[tuple], keys: tuple[str, ...], count: int) -> Iterator[None]:
    """Yield once per structure a worker reports done (or once per structure of a worker
    that failed); the workers run concurrently."""
    lines: queue.Queue[str | None] = queue.Queue()
    procs = []
    for part in (pending[i::count] for i in range(count)):
        proc = subprocess.Popen([sys.executable, "-m", "costmodel.engine.workers"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(list(keys)) + "\n")
        proc.stdin.writelines(json.dumps(s) + "\n" for s in part)
        proc.stdin.close()
        threading.Thread(target=_relay, args=(proc, len(part), lines), daemon=True).start()
        procs.append(proc)
    finished = 0
    while finished < len(procs):
        line = lines.get()
        if line is None:
            finished += 1
        else:
            yield None


def _relay(proc: subprocess.Popen, expected: int, lines: queue.Queue) -> None:
    """Pass a worker's lines on; for a worker that dies early, the structures it owed."""
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += 1
        lines.put(line)
    proc.wait()
    for _ in range(expected - seen):
        lines.put("")
    lines.put(None)


def _tuples(value: Any) -> Any:
    """JSON's lists back as the tuples a structure is made of."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def main() -> None:
    """A worker: the keys (one JSON line), then one structure per line; one line out per
    structure compiled."""
    keys = tuple(json.loads(sys.stdin.readline()))
    for line in sys.stdin:
        compiled_subset(_tuples(json.loads(line)), keys)
        print("done", flush=True)


if __name__ == "__main__":
    main()
