"""What every suite shares: the run context, cases, and the loop that runs them safely.

A suite is a function ``cases(ctx) -> list[Case]``; a case's ``run(ctx)`` yields
:class:`~validate.report.results.Row` objects as it measures them, and the loop appends each to
the log at once. An out-of-memory error becomes an ``oom`` row and the run goes on; any
other exception becomes an ``error`` row (with its message) and the run goes on; Ctrl-C
stops after the rows already written, which ``--resume`` keeps.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from costmodel.specs.hardware import Hardware
from validate.report.results import ResultsLog, Row


@dataclass(frozen=True)
class Context:
    device: torch.device
    label: str
    """Device name written into every row (``cpu``, ``NVIDIA H200``)."""
    hardware: Hardware
    """The measured profile predictions use."""
    quick: bool = False
    profile_path: Path | None = None
    """The run's hardware profile file (the collectives suite writes its α-β fit there)."""


@dataclass(frozen=True)
class Case:
    suite: str
    name: str
    run: Callable[[Context], Iterator[Row]]


def is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def free_bytes(device: torch.device) -> int:
    """Memory a case may still allocate on ``device`` (bytes).

    On the host this is the kernel's ``MemAvailable`` (free pages plus the page cache it can
    drop), capped by the cgroup's remaining limit where one is set; ``MemFree`` alone reads a
    few hundred MiB on a machine whose cache is full after an install, and would skip every case.
    """
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return min(_meminfo_available(), _cgroup_left())


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _cgroup_left() -> int:
    """The cgroup v2 limit less its usage (bytes); unbounded where no limit is set."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return sys.maxsize
        return int(limit) - int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return sys.maxsize


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _failure(case: Case, ctx: Context, status: str, err: BaseException) -> Row:
    message = f"{type(err).__name__}: {err}".strip()[:500]
    return Row(
        suite=case.suite,
        case=case.name,
        quantity=status,
        predicted=None,
        measured=None,
        device=ctx.label,
        status=status,
        extra={"message": message},
    )


def run_case(case: Case, ctx: Context, log: ResultsLog) -> str:
    """Run one case, appending its rows as they come; returns the case status."""
    start, status = time.perf_counter(), "ok"
    try:
        for row in case.run(ctx):
            if (row.suite, row.case) != (case.suite, case.name):  # resume is keyed by case
                raise ValueError(
                    f"row of {row.suite}/{row.case} from case {case.suite}/{case.name}"
                )
            log.write([row])
            if row.status != "ok":
                status = row.status
    except KeyboardInterrupt:
        raise
    except Exception as err:  # a failed case is a result, not the end of the run
        status = "oom" if is_oom(err) else "error"
        log.write([_failure(case, ctx, status, err)])
        if status == "error":
            traceback.print_exc(file=sys.stderr)
    finally:
        _free(ctx.device)
    log.finish(case.suite, case.name, status, time.perf_counter() - start)
    return status


def run_cases(cases: list[Case], ctx: Context, log: ResultsLog) -> Counter:
    """Every case not already done, with a progress bar and one line per finished case."""
    todo = [c for c in cases if not log.is_done(c.suite, c.name)]
    if len(todo) < len(cases):
        print(f"resume: {len(cases) - len(todo)} of {len(cases)} cases already done")
    statuses: Counter = Counter()
    bar = tqdm(todo, unit="case", dynamic_ncols=True, file=sys.stderr, disable=None)
    for case in bar:
        bar.set_description(f"{case.suite}/{case.name}"[:60])
        start = time.perf_counter()
        status = run_case(case, ctx, log)
        statuses[status] += 1
        bar.write(f"{status:>7}  {case.suite}/{case.name}  {time.perf_counter() - start:.1f} s")
    return statuses
