"""Evaluate a large sweep's structure groups on every core, in order.

A planner's sweep evaluates tens of structure groups of up to a million candidates each:
numpy releases the GIL inside its array loops, so two threads run a sweep of Turing-NLG
530B's 1.35 M candidates in 0.36 s instead of 0.65-0.85 s on two cores
(``benchmarks/bench_calculon.py``). Results come back in the order of the items,
so a sweep's values do not depend on the thread count; at most ``2 x threads`` items are
in flight (each holds its group's columns and results).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

MIN_POINTS = 200_000
"""Points a sweep must have to use threads (below, starting them costs more than they save)."""


def cores() -> int:
    """The cores this process may use, at most ``COSTMODEL_WORKERS`` when set."""
    setting = os.environ.get("COSTMODEL_WORKERS", "")
    found = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return int(setting) if setting.isdigit() and int(setting) > 0 else found or 1


def threads_for(points: int) -> int:
    """Threads for a sweep of ``points``: one per core (``COSTMODEL_WORKERS`` caps it), 1
    below ``MIN_POINTS``."""
    return cores() if points >= MIN_POINTS else 1


def in_threads(fn: Callable[[Any], T], items: Iterable[Any], threads: int) -> Iterator[T]:
    """``map(fn, items)`` on ``threads`` threads, in the items' order, a bounded window of
    them in flight."""
    if threads <= 1:
        yield from map(fn, items)
        return
    with cf.ThreadPoolExecutor(threads) as pool:
        window: deque[cf.Future[T]] = deque()
        for item in items:
            window.append(pool.submit(fn, item))
            if len(window) >= 2 * threads:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()
