"""Command line: ``python -m costmodel estimate --model cs336-2.7b --batch 4 --seq 1024``.

Every ModelSpec and TrainSpec field is a kebab-case flag generated from the dataclasses, so
any model can be described on the command line; bad values are reported as one line naming
the field and the constraint (exit status 2), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from dataclasses import MISSING, fields

import sympy as sp

from . import specs
from .estimate import Estimate, estimate
from .hardware import HARDWARE, get_hardware
from .hf import model_from_hf_config
from .parallel import OVERLAP_RULES, ParallelSpec, fill_dp
from .presets import PRESETS, get_model
from .specs import ModelSpec, TrainSpec, field_docs
from .units import fmt_bytes, fmt_count

_CHOICES = {
    "ffn": specs.FFN_KINDS,
    "norm": specs.NORM_KINDS,
    "pos": specs.POS_KINDS,
    "precision": specs.PRECISIONS,
    "optimizer": specs.OPTIMIZERS,
    "optimizer_impl": specs.OPTIMIZER_IMPLS,
    "attention": specs.ATTENTION_KERNELS,
    "recompute": specs.RECOMPUTE_POLICIES,
    "overlap": OVERLAP_RULES,
}
_NEGATIONS = {"tied": "untied"}  # --tied/--untied reads better than --no-tied


def _int_arg(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer (got {text!r})") from None


def _add_spec_flags(parser: argparse.ArgumentParser, cls: type, skip: set[str]) -> None:
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(f"{cls.__name__} fields (override the preset)")
    for f in fields(cls):
        if f.name in skip:
            continue
        flag, help_text = "--" + f.name.replace("_", "-"), docs.get(f.name, "")
        if hints[f.name] is bool:
            neg = "--" + _NEGATIONS.get(f.name, "no-" + f.name.replace("_", "-"))
            group.add_argument(flag, dest=f.name, action="store_true", default=None, help=help_text)
            group.add_argument(neg, dest=f.name, action="store_false", help=f"not {flag}")
        elif f.name in _CHOICES:
            group.add_argument(flag, dest=f.name, choices=_CHOICES[f.name], help=help_text)
        else:
            default = "" if f.default is MISSING else f" (default {f.default})"
            kind = float if hints[f.name] is float else _int_arg
            group.add_argument(flag, dest=f.name, type=kind, help=help_text + default)


def _overrides(args: argparse.Namespace, cls: type) -> dict[str, typing.Any]:
    return {
        f.name: getattr(args, f.name)
        for f in fields(cls)
        if getattr(args, f.name, None) is not None and f.name != "name"
    }


def build_specs(args: argparse.Namespace) -> tuple[ModelSpec, TrainSpec]:
    """The specs a parsed command line describes (preset or HF config, then overrides)."""
    overrides = _overrides(args, ModelSpec)
    if getattr(args, "hf_config", None):
        model = model_from_hf_config(args.hf_config).replace(**overrides)
    elif args.model:
        model = get_model(args.model, **overrides)
    else:
        required = [f.name for f in fields(ModelSpec) if f.default is MISSING]
        missing = [f"--{n.replace('_', '-')}" for n in required if n not in overrides]
        if missing:
            raise ValueError(f"without --model or --hf-config, give {', '.join(missing)}")
        model = ModelSpec(**overrides)
    return model, TrainSpec(**_overrides(args, TrainSpec))


def build_layout(args, train: TrainSpec):
    """(train, parallel, hardware) from --hardware/--gpus/--microbatch and layout flags."""
    if not getattr(args, "hardware", None):
        given = [f for f in _overrides(args, ParallelSpec)] + (["gpus"] if args.gpus else [])
        if given:
            raise ValueError(f"--hardware is required with {', '.join(given)}")
        return train, None, None
    parallel = ParallelSpec(**_overrides(args, ParallelSpec))
    if args.gpus is not None:
        if args.dp is not None and args.dp * parallel.devices // parallel.dp != args.gpus:
            raise ValueError(
                f"dp * fsdp * tp * pp * cp must equal gpus (got "
                f"{parallel.devices} and gpus={args.gpus})"
            )
        parallel = fill_dp(parallel, args.gpus)
    if args.microbatch is not None:
        per_step = parallel.dp * parallel.fsdp * args.microbatch
        if args.microbatch < 1 or train.batch % per_step:
            raise ValueError(
                f"microbatch * dp * fsdp must divide batch (got microbatch="
                f"{args.microbatch}, dp*fsdp={per_step // args.microbatch}, "
                f"batch={train.batch})"
            )
        train = train.replace(grad_accum=train.batch // per_step)
    return train, parallel, get_hardware(args.hardware)


def _table(est: Estimate) -> str:
    v = est.values
    rows = [("model", f"{est.model.name}"), ("train", _train_line(est.train))]
    if est.parallel is not None:
        p = est.parallel
        rows.append(
            (
                "layout",
                f"{p.devices} x {est.hardware.name}: dp {p.dp}, fsdp {p.fsdp} "
                f"(ZeRO-{p.zero}), tp {p.tp}, pp {p.pp}, cp {p.cp}, "
                f"overlap {p.overlap}",
            )
        )
    sections = (
        ("params.", fmt_count),
        ("flops.", _fmt_flops),
        ("memory_bytes.", fmt_bytes),
        ("memory_bytes_per_device.", fmt_bytes),
        ("time_s.", _fmt_seconds),
        ("comm_bytes.", fmt_bytes),
        ("comm_time_s.", _fmt_seconds),
    )
    for prefix, fmt in sections:
        keys = [k for k in v if k.startswith(prefix) and "_by_op" not in k]
        if keys:
            rows.append(("", ""))
            rows.extend((k, fmt(v[k])) for k in keys)
    ratios = ("mfu", "hfu")
    extra = [
        k
        for k in ("tokens_per_s", "tflops_per_device", *ratios, "train_days", "train_cost")
        if k in v
    ]
    if extra:
        rows.append(("", ""))
        rows.extend((k, f"{v[k]:.1%}" if k in ratios else f"{v[k]:,.4g}") for k in extra)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {val}" if k else "" for k, val in rows)


def _fmt_seconds(t: float) -> str:
    return f"{t * 1e3:,.3f} ms" if t < 1 else f"{t:,.3f} s"


def _fmt_flops(n: float) -> str:
    return fmt_count(n, "FLOP")


def _train_line(t: TrainSpec) -> str:
    return (
        f"batch {t.batch} x seq {t.seq} (micro-batch {t.micro_batch}), {t.precision}, "
        f"{t.optimizer}, attention {t.attention}, recompute {t.recompute}"
    )


def _cmd_estimate(args: argparse.Namespace) -> int:
    model, train = build_specs(args)
    train, parallel, hardware = build_layout(args, train)
    est = estimate(model, train, parallel, hardware)
    if args.token_budget:
        if parallel is None:
            raise ValueError("--token-budget needs --hardware (a step time)")
        days = args.token_budget / est["tokens_per_s"] / 86400
        est.values["train_days"] = days
        if args.price_per_hour:
            est.values["train_cost"] = days * 24 * parallel.devices * args.price_per_hour
    if args.formula:
        expr = est.expr(args.formula)
        print(f"{args.formula} =\n{sp.pretty(expr, use_unicode=True)}\n\nLaTeX: {sp.latex(expr)}")
        print(f"\nvalue: {est[args.formula]}")
        return 0
    print(est.to_json(indent=2) if args.json else _table(est))
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    rows = {name: get_model(name) for name in PRESETS}
    if args.json:
        print(
            json.dumps(
                {n: {f.name: getattr(m, f.name) for f in fields(m)} for n, m in rows.items()}
            )
        )
        return 0
    for name, m in rows.items():
        n = estimate(m, TrainSpec())["params.total"]
        print(
            f"{name:<14} D={m.d_model:<6} L={m.n_layers:<4} H={m.n_heads:<4} K={m.n_kv_heads:<4} "
            f"F={m.d_ff:<6} V={m.vocab:<7} {m.ffn:<7} params {n:,}"
        )
    return 0


def make_parser() -> argparse.ArgumentParser:
    from .cli_attention import add_attention
    from .cli_solve import add_bounds_and_solve

    parser = argparse.ArgumentParser(prog="python -m costmodel", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    est = sub.add_parser("estimate", help="parameters, FLOPs, memory (and time on hardware)")
    add_model_args(est)
    est.add_argument("--json", action="store_true", help="print one JSON object")
    est.add_argument(
        "--formula", metavar="QUANTITY", help="print the expression, e.g. flops.forward"
    )
    add_layout_args(est)
    est.add_argument("--token-budget", type=float, help="tokens to train on: adds train_days")
    est.add_argument("--price-per-hour", type=float, help="$ per device-hour: adds train_cost")
    est.set_defaults(func=_cmd_estimate)
    pre = sub.add_parser("presets", help="list the preset models")
    pre.add_argument("--json", action="store_true")
    pre.set_defaults(func=_cmd_presets)
    add_bounds_and_solve(sub)
    add_attention(sub, _int_arg)
    return parser


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--model / --hf-config and every ModelSpec and TrainSpec field."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", help=f"preset: {', '.join(PRESETS)}")
    src.add_argument("--hf-config", metavar="PATH", help="a local Hugging Face config.json")
    _add_spec_flags(parser, TrainSpec, skip=set())
    _add_spec_flags(parser, ModelSpec, skip={"name"})


def add_layout_args(parser: argparse.ArgumentParser) -> None:
    """--hardware, --gpus, --microbatch and every ParallelSpec field."""
    parser.add_argument("--hardware", help=f"{', '.join(HARDWARE)}, or a profile .json")
    parser.add_argument("--gpus", type=_int_arg, help="devices; dp fills what the others leave")
    parser.add_argument(
        "--microbatch", type=_int_arg, help="sequences per device per micro-batch (sets grad_accum)"
    )
    _add_spec_flags(parser, ParallelSpec, skip=set())


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `| head` closed the pipe; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except (ValueError, KeyError, TypeError) as err:
        message = err.args[0] if err.args else str(err)
        print(f"{parser.prog} {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
