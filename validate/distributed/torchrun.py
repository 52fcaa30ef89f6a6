"""The distributed checks under ``torchrun``, on one node or several.

    torchrun --standalone --nproc-per-node 2 -m validate.distributed.torchrun fsdp
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:PORT \
        -m validate.distributed.torchrun tp

Checks: ``collectives`` (timings per op and size), ``ddp`` (each variant's step and sync
time), ``fsdp`` / ``fsdp-by-hand`` / ``tp`` (one step's collectives and bytes), ``pipeline``
(each rank's bytes under 1F1B over all ranks, measured and predicted). Rank 0
prints one JSON object; the process group times out (bounded) if a rank dies or hangs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch.distributed as dist

from costmodel.parallel.collectives import DDP_VARIANTS
from validate.distributed import pipeline
from validate.distributed.checks import step, time_variant
from validate.distributed.collectives import bench
from validate.distributed.launch import run_distributed
from validate.distributed.pipeline import PipelineCase

CHECKS = {
    "collectives": lambda rank, world: bench(rank, world, [2**k for k in range(20, 27, 2)], 3),
    "ddp": lambda rank, world: {
        v: time_variant(rank, world, v, 5, 256, 0.25) for v in DDP_VARIANTS
    },
    "fsdp": lambda rank, world: step(rank, world, "fsdp", 2 * world, 64, "fp32"),
    "fsdp-by-hand": lambda rank, world: step(rank, world, "fsdp-by-hand", 2 * world, 64, "fp32"),
    "tp": lambda rank, world: step(rank, world, "tp", 2, 64, "fp32"),
    "pipeline": lambda rank, world: _pipeline(rank, world),
}


def _pipeline(rank: int, world: int) -> dict:
    """1F1B over ``world`` stages: this rank's bytes, measured and as costmodel predicts."""
    case = PipelineCase(world=world, n_layers=max(4, world), micro_batches=2 * world,
                        batch=4 * world)  # fmt: skip
    return {"measured": pipeline.measure(rank, world, case),
            "predicted": pipeline.predicted(case)[rank]}  # fmt: skip


def _check(rank: int, world: int, name: str) -> None:
    result = CHECKS[name](rank, world)
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        print(json.dumps({"check": name, "world": world, "ranks": gathered}, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("check", choices=list(CHECKS))
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    run_distributed(_check, args.check, timeout_s=args.timeout_s)
    # The group is destroyed and the result printed. Leave without running C++ static
    # destructors: gloo's threads sometimes abort there on CPU ("terminate called without
    # an active exception", about 1 exit in 3 with torch 2.13), which torchrun would report
    # as a failed run after the work succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
