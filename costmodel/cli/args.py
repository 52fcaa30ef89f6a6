"""Command-line flags generated from the inputs schema, and the setup a command line gives.

Every input of :data:`costmodel.inputs.INPUTS` is a kebab-case flag (``--n-kv-heads``,
``--bias/--no-bias``, ``--tied/--untied``); an unset flag is None, "not given", so the
specs' own defaults and rules apply exactly as in the app.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from costmodel.engine.fit import DEFAULT_HEADROOM
from costmodel.inputs import (
    BY_KEY,
    FRONT,
    MODEL_INPUTS,
    PARALLEL_INPUTS,
    TRAIN_INPUTS,
    Input,
    Setup,
    build,
)
from costmodel.specs.model import ModelSpec

_NEGATIONS = {"tied": "untied"}  # --tied/--untied reads better than --no-tied


def to_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of a command's answer, where a value without bound (an infinite time, a
    throughput of 0 over 0) is ``null``, as the text answers say "none": strict JSON."""
    return json.dumps(_finite(value), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def int_arg(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer (got {text!r})") from None


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def negation(key: str) -> str:
    """The flag that sets a bool input to False (``--no-sequence-parallel``, ``--untied``)."""
    return "--" + _NEGATIONS.get(key, "no-" + key.replace("_", "-"))


def add_inputs(parser: argparse.ArgumentParser, title: str, inputs: tuple[Input, ...]) -> None:
    group = parser.add_argument_group(title)
    for i in inputs:
        shown = "" if i.default is None else f" (default {i.default})"
        if i.kind is bool:
            neg = negation(i.key)
            group.add_argument(flag(i.key), dest=i.key, action="store_true", default=None,
                               help=i.help + shown)  # fmt: skip
            group.add_argument(neg, dest=i.key, action="store_false", help=f"not {flag(i.key)}")
        elif i.choices is not None and i.key != "model":
            group.add_argument(flag(i.key), dest=i.key, choices=i.choices, type=i.kind,
                               help=i.help + shown)  # fmt: skip
        else:
            kind = int_arg if i.kind is int else i.kind
            group.add_argument(flag(i.key), dest=i.key, type=kind, help=i.help + shown)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--model / --hf-config and every ModelSpec and TrainSpec field."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--model", help=f"preset: {', '.join(FRONT['model'].choices or ())}")
    src.add_argument("--hf-config", metavar="PATH", help=FRONT["hf_config"].help)
    add_inputs(parser, "TrainSpec fields", TRAIN_INPUTS)
    add_inputs(parser, "ModelSpec fields (override the preset)", MODEL_INPUTS)


def add_layout_args(parser: argparse.ArgumentParser, hardware_default: str | None = None):
    """--hardware, --gpus, --microbatch and every ParallelSpec field."""
    parser.add_argument("--hardware", default=hardware_default, help=FRONT["hardware"].help)
    add_inputs(parser, "cluster", (FRONT["gpus"], FRONT["microbatch"]))
    add_inputs(parser, "ParallelSpec fields", PARALLEL_INPUTS)


def add_headroom(parser: argparse.ArgumentParser, default: float | None = None) -> None:
    """--memory-headroom: the fit rule's share of device memory (costmodel.engine.fit)."""
    parser.add_argument(
        "--memory-headroom",
        type=float,
        default=default,
        help="a layout fits when its peak allocated bytes are at most this share of "
        f"device memory (default {DEFAULT_HEADROOM}: room for the CUDA context, NCCL "
        "buffers and fragmentation)",
    )


def values_of(args: argparse.Namespace) -> dict[str, Any]:
    """The inputs a parsed command line gives (None where a flag was not used)."""
    return {k: getattr(args, k) for k in BY_KEY if getattr(args, k, None) is not None}


def build_setup(args: argparse.Namespace) -> Setup:
    return build(values_of(args))


def build_model_only(args: argparse.Namespace) -> tuple[ModelSpec, Any]:
    """(model, train) of a command that takes no layout."""
    setup = build({k: v for k, v in values_of(args).items() if BY_KEY[k].section != "cluster"})
    return setup.model, setup.train


def device_word(hw: Any) -> str:
    """What a device is called in a column or a unit: GPU, chip (a TPU) or device."""
    return {"gpu": "GPU", "tpu": "chip"}.get(hw.kind, "device")
