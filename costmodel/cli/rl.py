"""``python -m costmodel rl``: one RL post-training step (``costmodel.rl``): generation,
scoring, training and weight sync, and the share of the step spent generating."""

from __future__ import annotations

import argparse

from costmodel.answers.serve import serve_caveats
from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.hf import model_from_hf_config
from costmodel.catalog.presets import PRESETS, get_model
from costmodel.cli.args import int_arg, to_json
from costmodel.engine.caveats import caveats
from costmodel.engine.quantities import nest
from costmodel.inputs import FRONT
from costmodel.rl import PLACEMENTS, RLSpec, rl_step
from costmodel.rl.spec import COLOCATED_MEMORY, REASONING_SIGMA, SEPARATE_MEMORY
from costmodel.rl.step import training_estimate
from costmodel.specs.engines import DEFAULT as DEFAULT_ENGINE
from costmodel.specs.engines import ENGINES
from costmodel.specs.model import RECOMPUTE_POLICIES, ModelSpec
from costmodel.specs.parallel import FRAMEWORKS
from costmodel.units import fmt_bytes, fmt_seconds


def _spec(args: argparse.Namespace) -> RLSpec:
    return RLSpec(prompts=args.prompts, samples=args.samples, input=args.input,
                  output=args.output, gpus=args.gpus, placement=args.placement,
                  rollout_gpus=args.rollout_gpus, rollout_tp=args.rollout_tp,
                  rollout_engine=args.rollout_engine or DEFAULT_ENGINE,
                  rollout_memory=args.rollout_memory, response_sigma=args.response_sigma,
                  max_output=args.max_output, reference=not args.no_reference,
                  old_logprobs=not args.no_old_logprobs, framework=args.framework,
                  train_tp=args.train_tp, train_pp=args.train_pp, train_ep=args.train_ep,
                  train_recompute=args.train_recompute,
                  sequence_parallel=args.sequence_parallel, pack_tokens=args.pack_tokens,
                  minibatches=args.minibatches, rope_scaling=args.rope_scaling)  # fmt: skip


def _limit(spec: RLSpec, out: dict[str, float], rows: list[tuple[str, float, str]]) -> str:
    """The phase that sets the step: the longest, but under ``async`` (generation one step
    ahead, beside scoring and training) the longer of generation and the two after it."""
    step = out["rl.step_s"]
    if spec.placement == "async":
        trainer = out["rl.scoring_s"] + out["rl.train_s"]
        if trainer >= out["rl.generation_s"]:
            return (f"scoring and training ({trainer / step:.0%} of the step; generation, "
                    f"{fmt_seconds(out['rl.generation_s'])}, runs beside them one step "
                    "ahead)")  # fmt: skip
        return (f"generation ({out['rl.generation_s'] / step:.0%} of the step; scoring and "
                "training run beside it on the previous step's samples)")  # fmt: skip
    name, seconds, _ = max(rows, key=lambda r: r[1])
    return f"{name} ({seconds / step:.0%} of the step)"


def _recompute_hint(spec: RLSpec) -> str:
    """Recomputation as a way to fit, where the trainer does not recompute in full yet."""
    return "" if spec.train_recompute == "full" else (
        ", or recompute activations (--train-recompute full)")  # fmt: skip


def _said(default: bool) -> str:
    return " (the default; --train-recompute)" if default else ""


def _assumptions(spec: RLSpec, out: dict) -> str:
    scorers = [n for n, on in (("old policy", spec.old_logprobs), ("reference", spec.reference))
               if on]  # fmt: skip
    if spec.response_sigma:
        lengths = (
            f"lognormal response lengths (sigma {spec.response_sigma:g}, mean "
            f"{out['rl.response_mean']:,.0f}, cut at {out['rl.response_longest']:,})"
        )
    else:
        lengths = (
            "every response the mean (a lower bound: a rollout waits for its longest; "
            "--response-sigma and --max-output price the tail)"
        )
    packing = (
        f"packed to {spec.pack_tokens:,} tokens"
        if spec.pack_tokens
        else "one sequence per micro-batch"
    )
    pools = ""
    if spec.placement != "colocated":  # the split of the GPUs, said where defaulted
        rollout = spec.rollout_gpus or spec.gpus - out["rl.train_gpus"]
        said = " (default: half; --rollout-gpus)" * (not spec.rollout_gpus)
        pools = f"{rollout} of the {spec.gpus} GPUs generate, {out['rl.train_gpus']} train{said}; "
    return (f"{pools}{spec.samples} samples per prompt; {lengths}; scoring by "
            f"{', '.join(scorers) or 'no model'}; training {spec.framework}, recompute "
            f"{spec.train_recompute}{_said(spec.train_recompute == 'none')}, {packing}, "
            f"{spec.minibatches} optimizer step(s); the rollout engine "
            f"{ENGINES[spec.rollout_engine].title} takes {spec.engine_memory():g} of a GPU"
            f"{' (default; --rollout-memory)' if spec.rollout_memory is None else ''}; "
            "bf16 weights synced")  # fmt: skip


DEFAULT_HARDWARE = "h100-sxm"
"""The device ``rl`` prices on where ``--hardware`` is not given (said in its header)."""


def _n(count: int, noun: str) -> str:
    """``count`` of ``noun``, plural but for one ("1 GPU", "8 GPUs")."""
    return f"{count:,} {noun}{'s' * (count != 1)}"


def _model(args: argparse.Namespace) -> ModelSpec:
    """``--model``'s preset or ``--hf-config``'s model."""
    if args.hf_config is None:
        return get_model(args.model)
    return model_from_hf_config(args.hf_config)


def rl_caveats(model: ModelSpec, spec: RLSpec, hardware: str, out: dict) -> list[str]:
    """The caveats ``estimate`` gives the training step (its device's calibration, MoE
    training) and, for a mixture-of-experts model, ``serve``'s for its rollouts."""
    est = training_estimate(model, spec, hardware, out["rl.response_mean"])
    said = caveats(est)
    if model.n_experts > 0:
        said += [c for c in serve_caveats(model, get_hardware(hardware))
                 if c.startswith("mixture-of-experts")]  # fmt: skip
    return said


def _cmd_rl(args: argparse.Namespace) -> int:
    spec = _spec(args)
    hardware = args.hardware or DEFAULT_HARDWARE
    model = _model(args)
    out = rl_step(model, spec, hardware)
    warned = rl_caveats(model, spec, hardware, out)
    if args.json:
        verdict = {"fits": bool(out["rl.train_fits"])}
        print(to_json({"model": model.name, "hardware": hardware, "verdict": verdict,
                          "caveats": warned, **nest(out)}, indent=2))  # fmt: skip
        return 0
    step = out["rl.step_s"]
    said = " (the default --hardware)" * (args.hardware is None)
    print(f"{model.name} on {args.gpus} x {hardware}{said} ({spec.placement}): "
          f"{spec.prompts} prompts x {spec.samples} samples of {spec.input:,} + "
          f"{spec.output:,} tokens")  # fmt: skip
    rows = [
        ("generation", out["rl.generation_s"],
         f"{_n(out['rl.rollout_replicas'], 'engine')} of tp {spec.rollout_tp}, up to "
         f"{out['rl.rollout_peak_batch']} sequences at once, {out['rl.rollout_iterations']:,} "
         f"iterations, {_n(out['rl.rollout_preemptions'], 'preemption')}"),
        ("scoring (forward passes)", out["rl.scoring_s"], ""),
        ("training", out["rl.train_s"],
         f"{spec.framework} over {_n(out['rl.train_gpus'], 'GPU')}, micro-batch "
         f"{out['rl.train_micro_batch']}, peak {fmt_bytes(out['rl.train_peak_bytes'])}"
         + ("" if out["rl.train_fits"] else " (does NOT fit)")),
        ("weight sync", out["rl.weight_sync_s"], ""),
    ]  # fmt: skip
    if not out["rl.train_fits"]:  # no step time for a step that does not fit (as estimate)
        print(f"  verdict: does NOT fit: training peaks at {fmt_bytes(out['rl.train_peak_bytes'])}"
              f" a GPU, over the {fmt_bytes(out['rl.train_budget_bytes'])} the fit rule allows "
              f"on {hardware} (0.9 of its memory): train on more GPUs (--gpus), or split the "
              f"model further (--train-tp, --train-pp"
              f"{', --train-ep' * (model.n_experts > 0)})"
              f"{_recompute_hint(spec)}")  # fmt: skip
        print(f"  assumptions: {_assumptions(spec, out)}")
        print("  step: none: training does not fit")
        _print_caveats(warned)
        return 0
    print(f"  verdict: fits; limited by {_limit(spec, out, rows)}")
    print(f"  assumptions: {_assumptions(spec, out)}")
    for name, seconds, how in rows:
        print(f"  {name:<26} {fmt_seconds(seconds):>9}  {seconds / step:6.1%}  {how}")
    print(f"  {'step':<26} {fmt_seconds(step):>9}  generation {out['rl.generation_share']:.1%}"
          f" of it; {out['rl.tokens_per_s']:,.0f} tokens/s over the {_n(spec.gpus, 'GPU')} "
          "(prompts and responses of the step over its time)")  # fmt: skip
    _print_caveats(warned)
    return 0


def _print_caveats(said: list[str]) -> None:
    for text in said:
        print(f"  caveat: {text}")


def add_rl(sub) -> None:
    p = sub.add_parser("rl", help="one RL step: generation, scoring, training, weight sync")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=f"preset: {', '.join(PRESETS)}")
    src.add_argument("--hf-config", metavar="PATH", help=FRONT["hf_config"].help)
    p.add_argument("--hardware", help=f"{', '.join(HARDWARE)} or .json (default "
                   f"{DEFAULT_HARDWARE})")  # fmt: skip
    p.add_argument("--gpus", type=int_arg, required=True, help="GPUs of the step (generation "
                   "and training)")  # fmt: skip
    p.add_argument("--prompts", type=int_arg, required=True, help="prompts per step")
    p.add_argument("--samples", type=int_arg, default=8, help="responses per prompt (G)")
    p.add_argument("--input", type=int_arg, required=True, help="prompt tokens")
    p.add_argument("--output", type=int_arg, required=True, help="mean response tokens")
    p.add_argument("--placement", choices=PLACEMENTS, default="colocated", help="colocated "
                   "(the default): every GPU generates, then trains; separate: two pools, one "
                   "after the other; async: generation beside scoring and training, one step "
                   "off-policy")  # fmt: skip
    p.add_argument("--rollout-gpus", type=int_arg, default=0, help="separate pools (0: half)")
    p.add_argument("--rollout-tp", type=int_arg, default=1, help="tensor parallelism of a "
                   "rollout engine (its replicas fill the generating GPUs)")  # fmt: skip
    p.add_argument("--rollout-engine", choices=list(ENGINES), help="the rollout's serving "
                   f"engine (default {DEFAULT_ENGINE}; see serve --engine)")  # fmt: skip
    p.add_argument(
        "--rollout-memory",
        type=float,
        help=f"the engine's share of a GPU, in (0, 1] (vLLM's gpu_memory_utilization; "
        f"default {COLOCATED_MEMORY:g} colocated, {SEPARATE_MEMORY:g} separate)",
    )
    p.add_argument(
        "--response-sigma",
        type=float,
        default=0.0,
        help="log-space spread of lognormal response lengths (0: all the mean; "
        f"about {REASONING_SIGMA:g} in reasoning RL)",
    )
    p.add_argument(
        "--max-output",
        type=int_arg,
        default=0,
        help="the longest response (max_new_tokens; 0: the model's positions)",
    )
    p.add_argument("--no-reference", action="store_true", help="no KL to a reference model")
    p.add_argument("--no-old-logprobs", action="store_true", help="no old-policy forward")
    p.add_argument("--framework", choices=FRAMEWORKS, default="fsdp2", help="the trainer")
    p.add_argument("--train-tp", type=int_arg, default=1, help="the trainer's tensor parallelism")
    p.add_argument("--train-pp", type=int_arg, default=1, help="the trainer's pipeline stages")
    p.add_argument("--train-ep", type=int_arg, default=1, help="the trainer's expert "
                   "parallelism (a mixture-of-experts model)")  # fmt: skip
    p.add_argument("--train-recompute", choices=RECOMPUTE_POLICIES, default="none",
                   help="the trainer's activation recomputation (default none)")  # fmt: skip
    p.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="the trainer's tp splits the sequence (needed for MoE under tp > 1)",
    )
    p.add_argument(
        "--pack-tokens",
        type=int_arg,
        default=0,
        help="tokens per packed training micro-batch (0: one sequence each)",
    )
    p.add_argument(
        "--minibatches",
        type=int_arg,
        default=1,
        help="optimizer steps per RL step (rollout batch / training batch)",
    )
    p.add_argument(
        "--rope-scaling",
        type=float,
        default=1.0,
        help="factor the rollout "
        "engine's RoPE scaling stretches the positions by (a response past them)",
    )
    p.add_argument("--json", action="store_true", help="the step's numbers as JSON")
    p.set_defaults(func=_cmd_rl)
