"""``python -m costmodel rl``: one RL post-training step (``costmodel.rl``): generation,
scoring, training and weight sync, and the share of the step spent generating."""

from __future__ import annotations

import argparse
import json

from costmodel.catalog.hardware import HARDWARE
from costmodel.catalog.presets import PRESETS
from costmodel.rl import PLACEMENTS, RLSpec, rl_step
from costmodel.rl.step import COLOCATED_MEMORY
from costmodel.units import fmt_bytes, fmt_seconds


def _cmd_rl(args: argparse.Namespace) -> int:
    spec = RLSpec(prompts=args.prompts, samples=args.samples, input=args.input,
                  output=args.output, gpus=args.gpus, placement=args.placement,
                  rollout_gpus=args.rollout_gpus, rollout_tp=args.rollout_tp,
                  reference=not args.no_reference,
                  old_logprobs=not args.no_old_logprobs)  # fmt: skip
    out = rl_step(args.model, spec, args.hardware)
    if args.json:
        print(json.dumps({"model": args.model, "hardware": args.hardware, **out}, indent=2))
        return 0
    step = out["rl.step_s"]
    print(f"{args.model} on {args.gpus} x {args.hardware} ({spec.placement}): "
          f"{spec.prompts} prompts x {spec.samples} samples of {spec.input:,} + "
          f"{spec.output:,} tokens")  # fmt: skip
    rows = [
        ("generation", out["rl.generation_s"],
         f"{out['rl.rollout_replicas']} replicas of tp {spec.rollout_tp}, "
         f"{out['rl.rollout_waves']} wave(s) of {out['rl.rollout_batch']} sequences"),
        ("scoring (forward passes)", out["rl.scoring_s"], ""),
        ("training", out["rl.train_s"],
         f"FSDP2 over {out['rl.train_gpus']} GPUs, peak {fmt_bytes(out['rl.train_peak_bytes'])}"
         + ("" if out["rl.train_fits"] else " (does NOT fit)")),
        ("weight sync", out["rl.weight_sync_s"], ""),
    ]  # fmt: skip
    largest = max(rows, key=lambda r: r[1])
    print(f"  limited by: {largest[0]} ({largest[1] / step:.0%} of the step)")
    scorers = [n for n, on in (("old policy", spec.old_logprobs), ("reference", spec.reference))
               if on]  # fmt: skip
    share = COLOCATED_MEMORY if spec.placement == "colocated" else 0.9
    print(f"  assumptions: {spec.samples} samples per prompt; mean lengths (a wave waits for no "
          f"long tail); scoring by {', '.join(scorers) or 'no model'}; training FSDP2 at "
          f"micro-batch 1 as `estimate` lays it out; the rollout engine takes {share:g} of a "
          f"GPU; bf16 weights synced")  # fmt: skip
    for name, seconds, how in rows:
        print(f"  {name:<26} {fmt_seconds(seconds):>9}  {seconds / step:6.1%}  {how}")
    print(f"  {'step':<26} {fmt_seconds(step):>9}  generation {out['rl.generation_share']:.1%}"
          f" of it; {out['rl.tokens_per_s']:,.0f} tokens/s")  # fmt: skip
    return 0


def add_rl(sub, int_arg) -> None:
    p = sub.add_parser("rl", help="one RL step: generation, scoring, training, weight sync")
    p.add_argument("--model", required=True, help=f"preset: {', '.join(PRESETS)}")
    p.add_argument("--hardware", default="h100-sxm", help=f"{', '.join(HARDWARE)} or .json")
    p.add_argument("--gpus", type=int_arg, required=True)
    p.add_argument("--prompts", type=int_arg, required=True, help="prompts per step")
    p.add_argument("--samples", type=int_arg, default=8, help="responses per prompt (G)")
    p.add_argument("--input", type=int_arg, required=True, help="prompt tokens")
    p.add_argument("--output", type=int_arg, required=True, help="mean response tokens")
    p.add_argument("--placement", choices=PLACEMENTS, default="colocated")
    p.add_argument("--rollout-gpus", type=int_arg, default=0, help="separate pools (0: half)")
    p.add_argument("--rollout-tp", type=int_arg, default=1)
    p.add_argument("--no-reference", action="store_true", help="no KL to a reference model")
    p.add_argument("--no-old-logprobs", action="store_true", help="no old-policy forward")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_rl)
