"""Calculon's own question, side by side: Turing-NLG 530B on 5,128 A100-80GB, global batch
up to 2,520, fp16 (Isaev et al., SC'23, the paper's example; issue 58, item 3).

Run: ``.venv/bin/python benchmarks/bench_calculon.py [--calculon DIR] [--repeats 3]``.
Each side runs as its user runs it, in a new process, on the wall clock:

* costmodel: ``python -m costmodel plan <Turing-NLG 530B> --hardware a100-80gb --gpus 5128
  --global-batch :2520`` (exactly 5,128 GPUs: every factorisation, dp 641 included), and
  the budget question ``--max-gpus 5128`` (every count up to it);
* Calculon, when ``--calculon DIR`` names a checkout installed in a Python of its own
  (``python -m venv V && V/bin/pip install -e DIR numpy pandas psutil``; the ``calculon``
  script is taken from ``V/bin`` beside ``DIR`` or from ``PATH``): ``calculon
  llm-optimal-execution models/turing-530B.json 5128 2520 float16 systems/a100_80g.json -m
  -c CORES out.json``, its best execution read from ``out.json``.

The ratio printed is Calculon's median wall time over costmodel's (the issue asks >= 20).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = [
    "--d-model", "20480", "--n-layers", "105", "--n-heads", "128", "--vocab", "51200",
    "--d-ff", "81920", "--ffn", "gelu", "--norm", "layernorm", "--pos", "learned",
    "--max-positions", "2048", "--seq", "2048", "--precision", "fp16-mixed",
    "--hardware", "a100-80gb", "--global-batch", ":2520",
]  # fmt: skip
"""Turing-NLG 530B as Calculon's ``models/turing-530B.json`` states it."""


def wall(cmd: list[str], cwd: Path | None = None) -> tuple[float, str]:
    """Seconds of one run of ``cmd`` in a new process, and what it printed."""
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def costmodel_side(gpus: str, repeats: int) -> tuple[list[float], str]:
    """Wall times of ``plan`` in new processes and its best row's line."""
    cmd = [sys.executable, "-m", "costmodel", "plan", *MODEL, *gpus.split(), "--top", "10"]
    runs = [wall(cmd) for _ in range(repeats)]
    best = next(line for line in runs[-1][1].splitlines() if line.strip().startswith("1 "))
    return [t for t, _ in runs], " ".join(best.split())


def calculon_binary(repo: Path) -> str:
    """The ``calculon`` script of the venv beside ``repo``, or the one on ``PATH``."""
    for venv in (repo.parent / "calc-venv", repo / ".venv", repo.parent / "calculon-venv"):
        if (venv / "bin" / "calculon").exists():
            return str(venv / "bin" / "calculon")
    found = shutil.which("calculon")
    if not found:
        sys.exit(f"no calculon script beside {repo} or on PATH (see this script's docstring)")
    return found


def calculon_side(repo: Path, repeats: int, cores: int) -> tuple[list[float], str]:
    """Wall times of Calculon's search in new processes and its best execution."""
    binary, times = calculon_binary(repo), []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [binary, "llm-optimal-execution", "models/turing-530B.json", "5128", "2520",
               "float16", "systems/a100_80g.json", "-m", "-c", str(cores), str(out)]  # fmt: skip
        for _ in range(repeats):
            times.append(wall(cmd, cwd=repo)[0])
        return times, describe(json.loads(out.read_text()))


def describe(found: dict) -> str:
    """Calculon's best execution (``found["0"]``: its layout and statistics), in words."""
    e, s = found["0"]["execution"], found["0"]["stats"]
    keys = (
        "tensor_par",
        "pipeline_par",
        "data_par",
        "batch_size",
        "microbatch_size",
        "activation_recompute",
        "weight_offload",
        "activations_offload",
        "optimizer_offload",
    )
    layout = ", ".join(f"{k} {e[k]}" for k in keys)
    return f"{layout}: {s['total_time']:.2f} s per step, {s['sample_rate']:.1f} sequences/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calculon", type=Path, help="Calculon's checkout (see the docstring)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                        help="Calculon's worker processes (-c)")  # fmt: skip
    args = parser.parse_args()
    print(f"Turing-NLG 530B, A100-80GB, global batch up to 2,520; {args.repeats} runs each, "
          f"new processes, {os.cpu_count()} cores", flush=True)  # fmt: skip
    ours = {}
    for gpus in ("--gpus 5128", "--max-gpus 5128"):
        times, best = costmodel_side(gpus, args.repeats)
        ours[gpus] = statistics.median(times)
        print(f"costmodel plan {gpus}: median {ours[gpus]:.2f} s "
              f"({', '.join(f'{t:.2f}' for t in times)})\n  best: {best}", flush=True)  # fmt: skip
    if args.calculon is None:
        print("Calculon: not run (--calculon DIR)")
        return
    times, best = calculon_side(args.calculon.resolve(), args.repeats, args.cores)
    theirs = statistics.median(times)
    print(f"Calculon llm-optimal-execution 5128 GPUs, -c {args.cores}: median {theirs:.2f} s "
          f"({', '.join(f'{t:.2f}' for t in times)})\n  best: {best}")  # fmt: skip
    for gpus, t in ours.items():
        print(f"Calculon / costmodel {gpus}: {theirs / t:.1f}x")


if __name__ == "__main__":
    main()
