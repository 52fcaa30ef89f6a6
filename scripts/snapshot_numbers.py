"""Snapshot costmodel's numbers, and compare two snapshots: the check a refactor passes.

    .venv/bin/python scripts/snapshot_numbers.py before.json
    ... change the code ...
    .venv/bin/python scripts/snapshot_numbers.py after.json --compare before.json

Evaluates, through the public API and the CLI only (so module moves do not matter), every
preset under five training structures on one device, seven layouts on three devices, two
sweeps and the CLI's estimate / bounds / solve / attention / presets commands, and writes
one JSON object. ``--compare`` prints each entry that differs and the largest relative
difference per quantity; exit status 1 when anything differs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any

import numpy as np

from costmodel import PRESETS, ParallelSpec, TrainSpec, estimate, get_hardware, get_model, sweep
from costmodel.cli import main as cli

STRUCTURES = [("bf16-mixed", "flash", "none"), ("fp32", "naive", "full"),
              ("bf16", "flash", "selective"), ("fp8", "naive", "none"),
              ("fp16-mixed", "flash", "full")]  # fmt: skip
LAYOUTS = [{}, {"fsdp": 4, "cp": 2}, {"dp": 2, "fsdp": 2, "zero": 1, "tp": 2},
           {"tp": 4, "sequence_parallel": True, "pp": 2, "pp_interleave": 2},
           {"fsdp": 2, "zero": 2, "pp": 4, "overlap": "sum"}, {"dp": 8},
           {"tp": 2, "pp": 2, "cp": 2}]  # fmt: skip
DEVICES = ("h100-sxm", "tpu-v5p", "a100-80gb")
COMMANDS = [
    "estimate --model gpt3-175b --seq 2048 --batch 64 --precision fp16-mixed "
    "--hardware a100-80gb --gpus 64 --tp 8 --pp 8 --microbatch 1 --json",
    "estimate --model llama3-8b --seq 8192 --batch 128 --hardware h100-sxm --gpus 8 --fsdp 4 "
    "--cp 2 --microbatch 1 --token-budget 15e12 --price-per-hour 2.5 --json",
    "bounds --model xxl --hardware tpu-v5p --fsdp 16 --tp 4 --mx 2 --my 1 --forward-only --json",
    "bounds --model llama3-8b --hardware h100-sxm --fsdp 8 --tp 2 --json",
    "solve min-fsdp --model xxl --budget-gb 95 --seq 8192 --json",
    "solve max-batch --model llama3-8b --seq 8192 --hardware h100-sxm --fsdp 8 --json",
    "solve max-seq --model llama3-8b --batch 8 --hardware h100-sxm --fsdp 8 --json",
    "attention --batch 2 --seq 4096 --head-dim 128 --heads 8 --kernel flash --dtype bf16 "
    "--causal --hardware h100-sxm --json",
    "presets --json",
]


def _one(*specs: Any) -> Any:
    try:
        return estimate(*specs).values
    except (ValueError, TypeError) as err:  # refused (or, in old versions, crashed): a result
        return f"error: {err}"


def snapshot() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in PRESETS:
        model = get_model(name)
        for prec, att, rec in STRUCTURES:
            seq = min(1024, model.max_positions)
            train = TrainSpec(batch=16, seq=seq, precision=prec, attention=att,
                              recompute=rec, grad_accum=2)  # fmt: skip
            out[f"{name}|{prec}|{att}|{rec}"] = _one(model, train)
            for i, layout in enumerate(LAYOUTS):
                for hw in DEVICES:
                    specs = (train.replace(batch=64), ParallelSpec(**layout), get_hardware(hw))
                    out[f"{name}|{prec}|{att}|{rec}|{i}|{hw}"] = _one(model, *specs)
    grid = sweep("llama3-8b", batch=[[1], [4], [16]], seq=[512, 1024, 2048])
    out["sweep"] = {k: np.asarray(v).tolist() for k, v in grid.items()}
    for command in COMMANDS:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            status = cli(command.split())
        out[f"cli: {command}"] = json.loads(buf.getvalue()) if status == 0 else status
    return out


def compare(new: dict[str, Any], old: dict[str, Any]) -> int:
    differing = [k for k in old if new.get(k) != old[k]]
    worst: dict[str, float] = {}
    for key in differing:
        a, b = old[key], new.get(key)
        print(f"differs: {key}")
        if isinstance(a, dict) and isinstance(b, dict):
            for q in set(a) & set(b):
                x, y = a[q], b[q]
                if x != y and isinstance(x, int | float) and isinstance(y, int | float):
                    rel = abs(x - y) / max(abs(x), 1e-300)
                    worst[q] = max(worst.get(q, 0.0), rel)
    for q, rel in sorted(worst.items(), key=lambda kv: -kv[1]):
        print(f"  largest relative difference of {q}: {rel:.3g}")
    print(f"{len(differing)} of {len(old)} entries differ")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="where to write this snapshot (JSON)")
    parser.add_argument("--compare", metavar="OLD", help="a snapshot to compare with")
    args = parser.parse_args(argv)
    snap = snapshot()
    with open(args.out, "w") as f:
        json.dump(snap, f, sort_keys=True, default=str)
    print(f"{len(snap)} entries -> {args.out}")
    if args.compare:
        with open(args.compare) as f:
            return compare(json.loads(json.dumps(snap, default=str)), json.load(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
