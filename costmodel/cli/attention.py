"""``python -m costmodel attention``: one attention call's FLOPs, memory, HBM traffic, time."""

from __future__ import annotations

import argparse
import json

from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.single.attention import (
    DTYPE_BYTES,
    KERNELS,
    AttentionSpec,
    attention_estimate,
    attention_time,
)
from costmodel.units import fmt_bytes, fmt_count


def _cmd_attention(args: argparse.Namespace) -> int:
    spec = AttentionSpec(
        batch=args.batch,
        seq=args.seq,
        head_dim=args.head_dim,
        heads=args.heads,
        kernel=args.kernel,
        dtype=args.dtype,
        causal=args.causal,
        tile=args.tile,
    )
    result: dict = dict(attention_estimate(spec))
    if args.hardware is not None:
        result.update(attention_time(spec, get_hardware(args.hardware)))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, value in result.items():
        if key.startswith("time_s"):
            shown = f"{value * 1e3:.3f} ms"
        elif "bytes" in key:
            shown = fmt_bytes(value)
        else:
            shown = fmt_count(value)
        print(f"{key:<28} {shown}")
    return 0


def add_attention(sub, int_arg) -> None:
    att = sub.add_parser("attention", help="one attention call: FLOPs, memory, HBM traffic")
    att.add_argument("--batch", type=int_arg, required=True)
    att.add_argument("--seq", type=int_arg, required=True)
    att.add_argument("--head-dim", type=int_arg, required=True)
    att.add_argument("--heads", type=int_arg, default=1)
    att.add_argument("--kernel", choices=KERNELS, default="flash")
    att.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="fp32")
    att.add_argument("--causal", action="store_true")
    att.add_argument("--tile", type=int_arg, default=64, help="flash tile size B")
    att.add_argument("--hardware", help=f"adds roofline time: {', '.join(HARDWARE)} or .json")
    att.add_argument("--json", action="store_true")
    att.set_defaults(func=_cmd_attention)
