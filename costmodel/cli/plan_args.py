"""``plan``'s flags and their parsing: comma lists, batch ranges, a batch in tokens."""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.cli.args import FRONT, add_inputs, int_arg
from costmodel.cli.sizing import add_sizing
from costmodel.engine.fit import DEFAULT_HEADROOM
from costmodel.engine.layouts import token_batches
from costmodel.engine.options import OBJECTIVES
from costmodel.engine.plan import FRAMEWORK_CHOICES
from costmodel.inputs import MODEL_INPUTS, TRAIN_INPUTS

TRAIN_KEYS = ("seq", "precision", "optimizer", "optimizer_impl", "attention",
              "attention_kernel", "elementwise", "dropout", "finetune", "lora_rank",
              "lora_targets")  # fmt: skip
"""The training inputs ``plan`` takes (the rest of the layout is searched)."""
MODEL_KEYS = {"model", "hf_config"} | {i.key for i in MODEL_INPUTS}


def _words(kind: type, name: str):
    def parse(text: str) -> tuple[Any, ...]:
        items = tuple(t.strip() for t in text.split(",") if t.strip())
        if not items:
            raise argparse.ArgumentTypeError(f"{name}: give a comma-separated list")
        if kind is float:  # one per --hardware kind: kept in order, repeats and all
            return tuple(_float(name, t) for t in items)
        values = tuple(int_arg(t) for t in items) if kind is int else items
        if name == "hardware":
            return values
        return tuple(dict.fromkeys(values))  # a choice listed twice is searched once

    return parse


def _float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: {text!r} is not a number") from None


def _batch_range(text: str) -> tuple[int, int]:
    """``N``, ``LO:HI`` or ``:HI`` (from 1)."""
    low, colon, high = text.partition(":")
    if colon and not low.strip():
        low = "1"
    ends = int_arg(low), int_arg(high if colon else low)
    if max(ends) > 2**53:
        raise argparse.ArgumentTypeError(f"global batch {text!r}: an end past 2^53 is no batch")
    return ends


def global_batch(args: argparse.Namespace, seq: int) -> tuple[int, int]:
    """(low, high) sequences per optimizer step: ``--global-batch`` as given, or
    ``--global-batch-tokens`` over ``seq`` (:func:`costmodel.engine.layouts.token_batches`)."""
    if args.global_batch_tokens is None:
        return args.global_batch
    return token_batches(*args.global_batch_tokens, seq)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``plan``."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help=f"preset: {', '.join(FRONT['model'].choices or ())}")
    src.add_argument("--hf-config", metavar="PATH", help=FRONT["hf_config"].help)
    add_inputs(p, "training", tuple(i for i in TRAIN_INPUTS if i.key in TRAIN_KEYS))
    add_inputs(p, "ModelSpec fields (override the preset)", MODEL_INPUTS)
    g = p.add_argument_group("cluster and search")
    g.add_argument("--hardware", required=True, type=_words(str, "hardware"),
                   help=FRONT["hardware"].help + "; a comma list compares the kinds' best "
                   "layouts")  # fmt: skip
    count = g.add_mutually_exclusive_group(required=True)
    count.add_argument("--gpus", type=int_arg, help="devices in the cluster, all used")
    count.add_argument("--max-gpus", type=int_arg,
                       help="a budget: any count up to this (whole nodes whose count has no "
                       "prime factor above 5, e.g. 5,120 of 5,128)")  # fmt: skip
    batch = g.add_mutually_exclusive_group(required=True)
    batch.add_argument(
        "--global-batch",
        "--batch",
        dest="global_batch",
        type=_batch_range,
        help="sequences per optimizer step (--batch too, as estimate and the Python API "
        "name it), or a range LO:HI or :HI (up to HI; the 8 largest batches in it with no "
        "prime factor above 7, and HI)",
    )
    batch.add_argument("--global-batch-tokens", type=_batch_range,
                       help="tokens per optimizer step (a multiple of --seq), or a range of "
                       "tokens LO:HI or :HI, searched as --global-batch's range of the whole "
                       "sequences inside it")  # fmt: skip
    g.add_argument(
        "--frameworks",
        type=_words(str, "frameworks"),
        default=("fsdp2", "megatron"),
        help=f"comma list of {', '.join(FRAMEWORK_CHOICES)} (default fsdp2,megatron)",
    )
    g.add_argument(
        "--recompute",
        type=_words(str, "recompute"),
        default=("none", "selective", "selective-op", "full"),
        help="comma list of recompute policies to try (default all four)",
    )
    g.add_argument(
        "--micro-batches",
        type=_words(int, "micro-batches"),
        default=None,
        help="comma list of sequences per device per micro-batch "
        "(default: every power of two that divides)",
    )
    g.add_argument("--ep-dispatchers", type=_words(str, "ep_dispatchers"),
                   default=("all-to-all",), help="comma list of expert-parallel dispatchers "
                   "to try for an MoE model: all-to-all, deepep, hybridep (default "
                   "all-to-all)")  # fmt: skip
    g.add_argument(
        "--max-tp", type=int_arg, default=None, help="largest tp (default: the devices of one node)"
    )
    g.add_argument(
        "--memory-headroom",
        type=float,
        default=DEFAULT_HEADROOM,
        help="a layout fits when its peak allocated bytes are at most this share of "
        f"device memory (default {DEFAULT_HEADROOM}; the rule estimate and solve use too)",
    )
    g.add_argument("--objective", choices=OBJECTIVES, default="time",
                   help="rank by time (tokens/s), cost (device-seconds per token, x each "
                   "kind's price across --hardware kinds: with --max-gpus, smaller counts may "
                   "win), tokens-per-gpu or mfu (default time)")  # fmt: skip
    g.add_argument(
        "--top",
        type=int_arg,
        default=10,
        help="layouts to show (default 10); "
        "device counts whose FLOP/s ceiling cannot reach them are not searched",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument(
        "--timeline", metavar="PATH", help="write the best layout's step timeline (.svg or .html)"
    )
    cost = "cost (adds days and cost per layout, and a sizing per GPU count)"
    add_inputs(p, cost, (FRONT["token_budget"],))
    p.add_argument(
        "--price-per-hour",
        type=_words(float, "price_per_hour"),
        help="per device-hour; a comma list gives one per --hardware kind",
    )
    add_sizing(p)
