"""Command-line flags generated from the specs, and the specs a command line describes."""

from __future__ import annotations

import argparse
import typing
from dataclasses import MISSING, fields

from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.hf import model_from_hf_config
from costmodel.catalog.presets import PRESETS, get_model
from costmodel.specs import model as specs
from costmodel.specs.model import ModelSpec, TrainSpec, field_docs
from costmodel.specs.parallel import OVERLAP_RULES, ParallelSpec, fill_dp

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


def int_arg(text: str) -> int:
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
            kind = float if hints[f.name] is float else int_arg
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
    parser.add_argument("--gpus", type=int_arg, help="devices; dp fills what the others leave")
    parser.add_argument(
        "--microbatch", type=int_arg, help="sequences per device per micro-batch (sets grad_accum)"
    )
    _add_spec_flags(parser, ParallelSpec, skip=set())
