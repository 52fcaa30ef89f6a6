"""``python -m validate.cluster {calibrate,check}`` under torchrun (or srun); see the package.

Every rank checks its input before it joins the group, so a bad flag ends every rank with
the same one line; the group (gloo on CPU, NCCL with one GPU per local rank) times out after
``--timeout-s`` when a rank dies or a rendezvous cannot be reached, and each rank leaves
without C++ static destructors (gloo's threads can abort there after the work succeeded).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from costmodel import get_hardware
from costmodel.catalog.hardware import resolve_device
from costmodel.specs.checks import SpecError
from validate.cluster import calibrate, check
from validate.cluster.check import LAYOUTS

ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SLURM = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m validate.cluster", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="seconds a collective or the rendezvous may take before every rank stops",
    )
    sub = p.add_subparsers(dest="command", required=True)
    cal = sub.add_parser(
        "calibrate", help="measure devices and links; write a hardware profile", allow_abbrev=False
    )
    cal.add_argument("--out", required=True, help="folder for measurements.jsonl and the profile")
    cal.add_argument("--quick", action="store_true", help="a smoke run: fewer shapes and sizes")
    cal.add_argument("--resume", action="store_true", help="measure only what --out lacks")
    cal.add_argument("--reps", type=int, default=5, help="timed repetitions per collective")
    chk = sub.add_parser(
        "check", help="a layout's real steps against costmodel's prediction", allow_abbrev=False
    )
    chk.add_argument("--hardware", required=True, help="a profile (calibrate's) or catalog name")
    chk.add_argument("--layout", choices=LAYOUTS, default="fsdp2")
    chk.add_argument("--from-plan", help="costmodel plan --json output: its first row's layout")
    chk.add_argument("--batch", type=int, default=0, help="global batch (default 2 x ranks)")
    chk.add_argument("--seq", type=int, default=0, help="default 64 on CPU, 1024 on GPU")
    chk.add_argument("--precision", default="", help="default fp32 on CPU, bf16-mixed on GPU")
    chk.add_argument("--d-model", type=int, default=0, help="reference model width (0: 128)")
    chk.add_argument("--layers", type=int, default=0, help="reference model depth (0: 2)")
    chk.add_argument("--out", default="cluster-check", help="folder for results.jsonl")
    chk.add_argument("--resume", action="store_true")
    return p


def _environment() -> None:
    """torchrun's variables, or SLURM's under srun; a clear error without either."""
    for var, slurm in SLURM.items():
        if var not in os.environ and slurm in os.environ:
            os.environ[var] = os.environ[slurm]
    missing = [v for v in ENV if v not in os.environ]
    if missing:
        raise SpecError(
            "launcher",
            f"validate.cluster runs under torchrun or srun (missing "
            f"{', '.join(missing)}): e.g. torchrun --standalone --nproc-per-node 2 "
            "-m validate.cluster calibrate --out DIR",
        )


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _join(device: torch.device, timeout_s: float) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(
            backend,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    except Exception as err:  # the store or a peer could not be reached in time
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        raise SpecError(
            "rendezvous",
            f"could not join the {backend} group at {where} within {timeout_s:.0f} s: {err}",
        ) from None
    if device.type == "cpu":  # ranks on one machine share its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // calibrate.ranks_on_host()))


def _one_rank(device: torch.device) -> None:
    """One rank measures its device only; its links must come from a catalog entry."""
    name = "a CPU"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        try:
            resolve_device(name)
            return
        except SpecError:
            pass
    raise SpecError(
        "world",
        f"calibrate on one rank measures the device and keeps its catalog entry's links, "
        f"and {name} has none: run 2 or more ranks (torchrun --nproc-per-node 2 ...)",
    )


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    try:
        _environment()
        device = _device()
        world = int(os.environ["WORLD_SIZE"])
        if args.command == "check":
            hw, case = get_hardware(args.hardware), check.make_case(args, world, device)
        elif world < 2:
            _one_rank(device)
        _join(device, args.timeout_s)
    except SpecError as err:
        sys.exit(f"validate.cluster: {err}")
    try:
        if args.command == "calibrate":
            calibrate.calibrate(args, device, argv)
        else:
            check.run(args, case, hw, device)
        dist.barrier()
    except (RuntimeError, dist.DistError) as err:  # a peer died, hung or lost its network
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        sys.exit(f"validate.cluster: rank {dist.get_rank()} lost its group ({first}); what was "
                 f"measured is in --out: rerun with --resume")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
