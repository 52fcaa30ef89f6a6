"""Run real code, measure it, and compare with costmodel's predictions.

    python -m validate.run [--suite all|accounting|model|attention|collectives|ddp|parallel|serve]
                           [--device auto|cpu|cuda] [--quick] [--out DIR] [--resume]
                           [--hardware PROFILE] [--filter S]

Writes ``DIR/results.jsonl`` (a row per measurement, appended as measured),
``DIR/cases.jsonl`` (finished cases, for ``--resume``), ``DIR/profile.json`` (this
machine's calibrated hardware profile, measured first unless ``--hardware`` names one) and
``DIR/report.md`` + ``DIR/report.html``. Exit status: 0 when every measured target holds;
1 if any case failed with an error (OOMs are results, not failures); 3 if no case errored
but a target (``validate.report.render.TARGETS``) was missed, named on the last line; 130
when interrupted (rows so far are kept). A bad ``--hardware`` or an unwritable ``--out``
ends at once with one line naming the option.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from costmodel.catalog.hardware import get_hardware
from costmodel.specs.hardware import Hardware
from validate.distributed.pool import pooled
from validate.probes.calibrate import profile
from validate.probes.cpu_env import reexec_with_caching_allocator
from validate.report.render import targets, write_report
from validate.report.results import ResultsLog, read_rows
from validate.suites import accounting as suite_accounting
from validate.suites import attention as suite_attention
from validate.suites import dist as suite_dist
from validate.suites import model as suite_model
from validate.suites import serving as suite_serving
from validate.suites.runner import Case, Context, run_cases

SUITES: dict[str, Callable[[Context], list[Case]]] = {
    "accounting": suite_accounting.cases,
    "model": suite_model.cases,
    "attention": suite_attention.cases,
    "collectives": suite_dist.collectives_cases,
    "ddp": suite_dist.ddp_cases,
    "parallel": suite_dist.parallel_cases,
    "serve": suite_serving.cases,
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available (use auto or cpu)")
    return torch.device(name)


def device_label(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def named_profile(name: str) -> Hardware:
    """``--hardware``: a catalog entry or a profile JSON; a bad one ends the run in one line."""
    try:
        return get_hardware(name)
    except (ValueError, TypeError, OSError) as err:
        raise SystemExit(f"--hardware {name}: {err}") from None


def open_log(out: Path, resume: bool) -> ResultsLog:
    """The run's results log; existing results without ``--resume``, or a folder that cannot
    be written, end the run in one line (before the slow calibration)."""
    try:
        return ResultsLog(out, resume=resume)
    except OSError as err:
        if isinstance(err, FileExistsError) and err.errno is None:  # ResultsLog's own: resume?
            raise SystemExit(str(err)) from None
        raise SystemExit(f"--out {out}: cannot write there ({err.strerror or err})") from None


def calibrated_profile(out: Path, device: torch.device) -> Hardware:
    """DIR/profile.json, else a fresh calibration of ``device`` saved there."""
    path = out / "profile.json"
    if not path.exists():
        print(f"calibrating {device_label(device)} (matmul FLOP/s, attention, bandwidth)...")
        path.write_text(json.dumps(profile(device, 2**30 if device.type == "cuda" else 2**28)))
    return get_hardware(str(path))


def missed_line(results: list[dict]) -> str | None:
    """``MISSED k of n targets: label (value x %, bound y %); ...``, or None when none is."""
    missed = [t for t in results if t["met"] is False]
    if not missed:
        return None
    what = "; ".join(
        f"{t['target']} (value {100 * t['value']:.2f} %, bound {100 * t['bound']:.2f} %)"
        for t in missed
    )
    return f"MISSED {len(missed)} of {len(results)} targets: {what}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m validate.run", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    parser.add_argument("--suite", default="all", choices=["all", *SUITES])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="small grids (minutes on a CPU)")
    parser.add_argument("--out", default="validate-results", help="output directory")
    parser.add_argument("--resume", action="store_true", help="skip cases already done in --out")
    parser.add_argument("--hardware", help="catalog name or profile JSON (default: calibrate)")
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    out = Path(args.out)
    named = named_profile(args.hardware) if args.hardware else None
    log = open_log(out, args.resume)
    hardware = named if named is not None else calibrated_profile(out, device)
    profile_path = None if args.hardware else out / "profile.json"
    ctx = Context(device, device_label(device), hardware, args.quick, profile_path)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    cases = [c for n in names for c in SUITES[n](ctx) if args.filter in f"{c.suite}/{c.name}"]
    statuses: Counter = Counter()
    try:
        with pooled():  # the distributed cases' ranks start once (validate.distributed.pool)
            statuses = run_cases(cases, ctx, log)
    except KeyboardInterrupt:
        write_report(out)
        print(f"\ninterrupted: rows so far are in {out}/results.jsonl; rerun with --resume")
        return 130
    md, _ = write_report(out)
    print(f"cases: {dict(statuses)}; report: {md}")
    results = targets(read_rows(out))
    for t in results:
        value = "not measured" if t["value"] is None else f"{100 * t['value']:.2f} %"
        print(f"  {t['target']}: {value} ({t['n']} rows)")
    missed = missed_line(results)
    if missed:
        print(missed)
    if statuses.get("error"):
        return 1
    return 3 if missed else 0


if __name__ == "__main__":
    reexec_with_caching_allocator("validate.run")
    sys.exit(main())
