"""What the kernel benchmarks share (``gemm_shapes.py``, ``attention_kernels.py``): their
command line, a kernel's time, and a log of one JSON row per case, appended as measured,
that a rerun resumes (the keys already there are skipped)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from validate.probes.calibrate import time_call

Case = tuple[str, dict[str, Any], Callable[[], tuple[dict[str, Any], str]]]
"""(key, the case's fields, a measurement returning (measured fields, a line to print))."""


def seconds(call: Callable[[], Any], device: torch.device) -> float:
    """Median seconds of ``call``: ``triton.testing.do_bench`` on a GPU (CUDA events, L2
    flushed before every call), ``time_call`` on a CPU."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median") / 1e3
    return time_call(call, device, 0.05)


def host_seconds(call: Callable[[], Any], device: torch.device, repeats: int = 20) -> float:
    """Median host seconds to issue ``call`` (its kernels queued, not waited for; the device
    drained before each repeat)."""
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return statistics.median(samples)


def arguments(doc: str, argv: list[str] | None) -> tuple[Path, torch.device, bool]:
    """``--out DIR [--device auto|cpu|cuda] [--quick]``: the folder, the device (named when
    a GPU), and whether to run the short grid."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for the rows")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="a few cases per kind")
    args = parser.parse_args(argv)
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available()
                                                      else "cpu")  # fmt: skip
    if name == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    device = torch.device(name)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    return Path(args.out), device, args.quick


def record(path: Path, cases: Sequence[Case], device: torch.device) -> None:
    """Measure each case not yet in ``path`` and append its row; a case the device cannot
    run (an OOM, a kernel the build lacks) is a row with ``error``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["key"] for line in path.open()} if path.exists() else set()
    with path.open("a") as log:
        for i, (key, fields, measure) in enumerate(cases, 1):
            if key in done:
                continue
            row: dict[str, Any] = {"key": key, **fields}
            try:
                measured, line = measure()
                row.update(measured)
            except (RuntimeError, NotImplementedError) as err:
                row["error"] = str(err).splitlines()[0][:200]
                line = f"error: {row['error']}"
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(f"[{i}/{len(cases)}] {key}: {line}", flush=True)
