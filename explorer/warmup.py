"""Warm the disk cache for the inputs one choice away, in a niced background process.

A structure (``costmodel.engine.quantities.structure_of``: the kinds and flags that change
expressions) met for the first time costs sympy 1-6 s: building its expressions, printing
their function, the Formulas tab's sizes, and, for a layout that does not fit, the
structures the nearest fitting change tries. Met before, in any process, it costs a file
read (``costmodel.engine.diskcache``). So after the Estimate page draws, the server hands
its inputs to ``python -m explorer.warmup`` (:func:`start`: once per structure, one
process at a time), which estimates every input one choice away (:data:`FIELDS`, the
likeliest clicks first) at low priority on an idle core, and stops after
:data:`LIMIT_S`. The next click then finds its structure on disk. ``COSTMODEL_WARMUP=off``
(or ``COSTMODEL_CACHE=off``, nowhere to keep the results) turns it off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from costmodel.engine.diskcache import cache_dir
from costmodel.engine.quantities import structure_of
from costmodel.inputs import Setup

FIELDS = ("precision", "model", "recompute", "attention", "framework", "zero",
          "sequence_parallel", "optimizer", "finetune", "elementwise", "attention_kernel",
          "optimizer_impl", "overlap", "grad_reduce_fp32", "ep_dispatcher", "ep_overlap",
          "lora_targets")  # fmt: skip
"""The choice inputs whose other options are warmed, the likeliest clicks first."""
LIMIT_S = 300.0
"""A warm-up process stops after this many seconds, done or not."""
MAX_INPUT_BYTES = 1 << 16
ROOT = Path(__file__).resolve().parents[1]
"""The folder holding ``explorer``: the warm-up's working directory."""

_lock = threading.Lock()
_handed: set[tuple] = set()  # structures whose neighbours this server has handed out
_process: subprocess.Popen | None = None


def enabled() -> bool:
    return os.environ.get("COSTMODEL_WARMUP", "").lower() != "off" and cache_dir() is not None


def start(values: Mapping[str, Any], setup: Setup) -> bool:
    """Start warming ``values``' neighbours, unless this structure's were handed out
    before or a warm-up is still running (the next page run tries again). True if
    started. Sessions run in threads of one server, hence the lock."""
    global _process
    if not enabled():
        return False
    key = structure_of(setup.model, setup.train, setup.parallel)
    with _lock:
        if key in _handed or (_process is not None and _process.poll() is None):
            return False
        try:
            sent = json.dumps(dict(values)).encode()
            _process = subprocess.Popen(
                [sys.executable, "-m", "explorer.warmup"], cwd=ROOT,  # wherever it was run
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            assert _process.stdin is not None
            _process.stdin.write(sent)
            _process.stdin.close()
        except (TypeError, ValueError, OSError):  # only a speed-up: never the page's error
            return False
        _handed.add(key)
    return True


def neighbours(
    values: Mapping[str, Any], fields: tuple[str, ...] = FIELDS
) -> Iterator[dict[str, Any]]:
    """Inputs that differ from ``values`` in one choice of ``fields``, field by field; a
    list's options nearest the current one first (the earlier first at equal distance)."""
    from costmodel.inputs import BY_KEY
    from explorer.state import options_of

    for key in fields:
        options = list(options_of(BY_KEY[key]))
        at = options.index(values[key]) if values.get(key) in options else 0
        for i in sorted(range(len(options)), key=lambda i: (abs(i - at), i)):
            if options[i] != values.get(key):
                yield {**values, key: options[i]}


def warm(
    values: Mapping[str, Any],
    fields: tuple[str, ...] = FIELDS,
    limit_s: float = LIMIT_S,
    stop: Callable[[], bool] = lambda: False,
) -> list[tuple]:
    """Estimate each neighbour of a new structure (its function, its Formulas rows and,
    if it does not fit, the nearest change that fits); ``stop()`` ends it early. The
    structures warmed, in order."""
    from explorer.state import setup_of

    deadline = time.monotonic() + limit_s

    def over() -> bool:
        return time.monotonic() > deadline or stop()

    current, _ = setup_of(values)
    seen = {structure_of(current.model, current.train, current.parallel)} if current else set()
    done = []
    for candidate in neighbours(values, fields):
        if over():
            return done
        setup, _ = setup_of(candidate)
        if setup is None:
            continue
        key = structure_of(setup.model, setup.train, setup.parallel)
        if key in seen:
            continue
        seen.add(key)
        _as_the_page_does(setup, key)
        done.append(key)
    return done


def _as_the_page_does(setup: Setup, structure: tuple) -> None:
    """What the Estimate page builds per structure: the estimate, the Formulas rows, the
    nearest change that fits where it does not, the Inverse tab's FSDP sweep (charts and
    the rest are scalar estimates of the same structure)."""
    from costmodel.engine.fit import budget_bytes, judge
    from explorer.formulas import formula_rows
    from explorer.headline import answer_of
    from explorer.inverse import full_min_fsdp

    est = setup.estimate()
    formula_rows(structure)
    if setup.parallel is not None and setup.hardware is not None:
        if not judge(est.values, setup.hardware).fits:
            answer_of(setup)  # the verdict's nearest change that fits
        full_min_fsdp(setup, budget_bytes(setup.hardware))


def main() -> None:
    if hasattr(os, "nice"):
        os.nice(10)  # the user's clicks come first
    values = json.loads(sys.stdin.read(MAX_INPUT_BYTES))
    server = os.getppid()
    warm(values, stop=lambda: os.getppid() != server)  # the server is gone: nobody to serve


if __name__ == "__main__":
    main()
