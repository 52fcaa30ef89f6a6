"""``python -m costmodel attention``: one attention call's FLOPs, memory, HBM traffic, time."""

from __future__ import annotations

import argparse

from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.cli.args import int_arg, to_json
from costmodel.engine.fit import DEFAULT_HEADROOM, budget_bytes
from costmodel.single.attention import (
    DTYPE_BYTES,
    KERNELS,
    AttentionSpec,
    attention_estimate,
    attention_time,
)
from costmodel.units import fmt_bytes, fmt_count


def _dtype(args: argparse.Namespace) -> str:
    """``--dtype``, else bf16 on an accelerator (fused kernels take 16-bit operands) and fp32
    without one or on a CPU (as validate/ measures there)."""
    if args.dtype is not None:
        return args.dtype
    on_cpu = args.hardware is None or get_hardware(args.hardware).kind == "cpu"
    return "fp32" if on_cpu else "bf16"


def _cmd_attention(args: argparse.Namespace) -> int:
    asked = args.dtype
    args.dtype = _dtype(args)
    args.dtype_said = "" if asked is not None else " (default)"
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
        print(to_json(result, indent=2))
        return 0
    print(_header(args))
    if args.hardware is not None:  # the verdict first, as every command says it
        hw = get_hardware(args.hardware)
        peak, allowed = result["memory_bytes.peak"], budget_bytes(hw)  # the one fit rule
        fits = peak <= allowed
        print(f"  verdict: {'fits' if fits else 'does NOT fit'}: peak {fmt_bytes(peak)} "
              f"{'<=' if fits else '>'} {fmt_bytes(allowed)} ({DEFAULT_HEADROOM:g} of "
              f"{hw.name}'s {fmt_bytes(hw.hbm_bytes)})"
              + ("" if fits else "; its times below are what it would take"))  # fmt: skip
    for key, value in result.items():
        if key.startswith("time_s"):
            shown = f"{value * 1e3:.3f} ms"
        elif "bytes" in key:
            shown = fmt_bytes(value)
        else:
            shown = fmt_count(value, "FLOP")
        print(f"  {LABELS.get(key, key):<40} {shown}")
    rates = [k for k in result if k.startswith("time_s.") and "kernel" in k]
    if rates and result["time_s.forward"] > min(result[k] for k in rates):
        print("  note: the roofline prices these tiles' reads of K and V from HBM, one pass "
              f"per tile of {spec.tile} queries; the device's kernel (larger tiles, "
              "reuse on chip) runs at its measured rate, which can be the faster")  # fmt: skip
    return 0


LABELS = {
    "flops.forward": "FLOPs forward (every score, as counted)",
    "flops.backward": "FLOPs backward (every score, as counted)",
    "flops.forward_executed": "FLOPs forward (the kernel runs)",
    "flops.backward_executed": "FLOPs backward (the kernel runs)",
    "memory_bytes.after_forward": "memory kept after forward",
    "memory_bytes.peak": "peak memory",
    "hbm_bytes.forward": "HBM traffic forward",
    "hbm_bytes.backward": "HBM traffic backward",
    "hbm_bytes": "HBM traffic, forward and backward",
    "time_s.forward": "time forward (roofline of these tiles)",
    "time_s.backward": "time backward (roofline of these tiles)",
    "time_s.forward_kernel": "time forward (the device's kernel rate)",
    "time_s.backward_kernel": "time backward (the device's kernel rate)",
}
"""How ``attention`` names each quantity (its key in ``--json``)."""


def _header(args: argparse.Namespace) -> str:
    """The call as priced, each default said."""
    defaults = {"heads": 1, "tile": 64, "kernel": "flash"}
    said = {k: " (default)" if getattr(args, k) == v else "" for k, v in defaults.items()}
    said["dtype"] = getattr(args, "dtype_said", "")
    mask = "causal" if args.causal else "full (non-causal; --causal masks)"
    on = f" on {args.hardware}" if args.hardware else ""
    tile = f", tiles of {args.tile}{said['tile']}" if args.kernel == "flash" else ""
    return (
        f"attention{on}: batch {args.batch} x seq {args.seq:,}, {args.heads} head(s)"
        f"{said['heads']} of {args.head_dim}, {mask}, {args.kernel}{said['kernel']}{tile}, "
        f"{args.dtype}{said['dtype']}"
    )


def add_attention(sub) -> None:
    att = sub.add_parser("attention", help="one attention call: FLOPs, memory, HBM traffic")
    att.add_argument("--batch", type=int_arg, required=True)
    att.add_argument("--seq", type=int_arg, required=True)
    att.add_argument("--head-dim", type=int_arg, required=True)
    att.add_argument("--heads", type=int_arg, default=1, help="heads (default 1)")
    att.add_argument(
        "--kernel",
        choices=KERNELS,
        default="flash",
        help="naive (the scores materialised) or flash (tiled; default)",
    )
    att.add_argument(
        "--dtype",
        choices=tuple(DTYPE_BYTES),
        help="the operands' dtype (default bf16 with an accelerator's --hardware, whose "
        "fused kernels take 16-bit operands; fp32 without one or on a CPU, as validate/ "
        "measures there)",
    )
    att.add_argument("--causal", action="store_true", help="a causal mask (default: none)")
    att.add_argument("--tile", type=int_arg, default=64, help="flash tile size B")
    att.add_argument("--hardware", help=f"adds roofline time: {', '.join(HARDWARE)} or .json")
    att.add_argument("--json", action="store_true")
    att.set_defaults(func=_cmd_attention)
