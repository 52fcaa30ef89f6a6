"""``bounds`` and ``solve`` subcommands of ``python -m costmodel``."""

from __future__ import annotations

import argparse
import json

from costmodel.book.bounds import bounds_report
from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.single.precision import PRECISIONS
from costmodel.units import GB, GIB, fmt_bytes


def _budget(args: argparse.Namespace) -> float | None:
    if args.budget_gb is not None and args.budget_gib is not None:
        raise ValueError("give --budget-gb or --budget-gib, not both")
    if args.budget_gb is not None:
        return args.budget_gb * GB
    if args.budget_gib is not None:
        return args.budget_gib * GIB
    return None


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    for key, value in result.items():
        if key == "latex":
            continue
        shown = fmt_bytes(value) if key.endswith("_bytes") and value is not None else value
        print(f"{key:<34} {shown}")


def _cmd_bounds(args: argparse.Namespace) -> int:
    from costmodel.cli.args import build_specs

    model, train = build_specs(args)
    hw = get_hardware(args.hardware)
    peak = args.peak_flops or hw.peak(PRECISIONS[train.precision].peak_dtype)
    bandwidth = args.bandwidth or (hw.link_bw_bidir if hw.kind == "tpu" else hw.link_bw)
    report = bounds_report(
        model,
        fsdp=args.fsdp,
        tp=args.tp,
        peak_flops=peak,
        bandwidth=bandwidth,
        mx=args.mx,
        my=args.my,
        overlap=args.overlap,
        forward_only=args.forward_only,
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for key, value in report.items():
        if isinstance(value, dict) and key != "latex":
            for sub, x in value.items():
                print(f"{key}.{sub:<28} {x:.6g}")
        elif key != "latex":
            print(f"{key:<38} {value}")
    print(f"\ncritical batch B* = {report['latex']['critical_batch_tokens']}")
    return 0


def _cmd_solve(args: argparse.Namespace) -> int:
    from costmodel.book.fsdp import min_fsdp
    from costmodel.cli.args import build_layout, build_specs
    from costmodel.engine.inverse import max_fitting

    model, train = build_specs(args)
    if args.question == "min-fsdp":
        budget = _budget(args)
        if budget is None:
            raise ValueError("min-fsdp needs --budget-gb or --budget-gib")
        tokens = train.seq if args.batch_tokens is None else args.batch_tokens
        result = min_fsdp(model, train, budget, tokens, args.sharded_activation_fraction)
    else:
        train, parallel, hw = build_layout(args, train)
        if parallel is None:
            raise ValueError(f"{args.question} needs --hardware (and a layout)")
        field = "batch" if args.question == "max-batch" else "seq"
        result = max_fitting(model, train, parallel, hw, field, _budget(args))
    _print(result, args.json)
    return 0


def add_bounds_and_solve(sub) -> None:
    from costmodel.cli.args import add_layout_args, add_model_args

    bnd = sub.add_parser(
        "bounds", help="batch at which training is compute-bound (Scaling Book ch. 5)"
    )
    add_model_args(bnd)
    bnd.add_argument("--hardware", default="tpu-v5p", help=f"{', '.join(HARDWARE)} or .json")
    for flag in ("--fsdp", "--tp", "--mx", "--my"):
        bnd.add_argument(flag, type=int, default=1)
    bnd.add_argument("--overlap", choices=("max", "sum"), default="max")
    bnd.add_argument("--forward-only", action="store_true")
    bnd.add_argument("--peak-flops", type=float, help="override C (FLOP/s)")
    bnd.add_argument("--bandwidth", type=float, help="override W per axis (bytes/s)")
    bnd.add_argument("--json", action="store_true")
    bnd.set_defaults(func=_cmd_bounds)

    sol = sub.add_parser("solve", help="inverse questions")
    sol.add_argument("question", choices=("min-fsdp", "max-batch", "max-seq"))
    add_model_args(sol)
    add_layout_args(sol)
    sol.add_argument("--budget-gb", type=float, help="memory budget in GB (1e9 bytes)")
    sol.add_argument("--budget-gib", type=float, help="memory budget in GiB (2^30 bytes)")
    sol.add_argument(
        "--batch-tokens",
        type=int,
        help="min-fsdp: tokens one device processes (default: one sequence)",
    )
    sol.add_argument("--sharded-activation-fraction", type=float, default=0.5)
    sol.add_argument("--json", action="store_true")
    sol.set_defaults(func=_cmd_solve)
