"""``python -m costmodel serve``: serving a model: its KV cache, memory per device, TTFT, TPOT
and throughput for a workload (``costmodel.serving``)."""

from __future__ import annotations

import argparse
from typing import Any

from costmodel.answers.serve import (
    DEFAULT_HARDWARE,
    DEFAULT_OUTPUT,
    SERVE_INPUTS,
    ServeAnswer,
    answer,
    spec_of,
)
from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.hf import model_from_hf_config
from costmodel.catalog.presets import PRESETS, get_model
from costmodel.cli.args import device_word, int_arg, to_json
from costmodel.specs.engines import DEFAULT as DEFAULT_ENGINE
from costmodel.specs.engines import ENGINES
from costmodel.specs.hardware import KERNEL_FAMILIES
from costmodel.specs.serving import ARRIVALS, FP8_SCALINGS, KV_DTYPES, PRECISIONS, ServeSpec
from costmodel.units import fmt_bytes, fmt_count, fmt_rate, fmt_seconds


def _rows(ans: ServeAnswer, spec: ServeSpec, unit: str) -> list[tuple[str, str]]:
    v, mem = ans.estimate.values, "memory_bytes_per_device."
    fit = ans.headline()
    share = (
        f"its share of tp {spec.tp}"
        if v["kv_split_over_tp"]
        else (f"whole on each of the tp {spec.tp} ranks")
    )
    per_device = f" a device ({share})" * (spec.tp > 1)
    nearest = f"; nearest fit: {ans.nearest}" if ans.nearest else ""
    memory = [
        (
            "verdict",
            f"{fit}: {fmt_bytes(v[mem + 'total'])} of {fmt_bytes(v[mem + 'budget'])} "
            f"per device; {ans.how_many()}{nearest}",
        ),
        *([("limited by", ans.limited_by())] if ans.fits else []),
        ("assumptions", ans.assumptions()),
        *[("caveat", text) for text in ans.caveats],
        ("KV cache per token", fmt_bytes(v["kv_bytes_per_token"]) + per_device),
        ("KV cache per sequence", fmt_bytes(v["kv_bytes_per_sequence"]) + per_device),
        ("weights", fmt_bytes(v[mem + "weights"])),
        ("KV cache (paged)", fmt_bytes(v[mem + "kv_cache_paged"])),
        ("workspace", fmt_bytes(v[mem + "workspace"])),
        *([("drafter", fmt_bytes(v[mem + "drafter"]))] if v.get(mem + "drafter") else []),
    ]
    if not ans.fits:
        pool = []
        if spec.prefill_replicas and not v["disaggregated.prefill_fits"]:
            pool = [("prefill pool", f"{spec.prefill_replicas} x tp {spec.prefill_degree}: a "
                     "prefill replica does NOT fit")]  # fmt: skip
        return [*memory, *pool, ("TTFT, TPOT, tokens/s", "none: the batch does not fit")]
    return memory + _time_rows(v, spec, unit)


def _spread(v: dict[str, Any], name: str) -> str:
    """``mean 1.2 s, p50 ..., p90 ..., p99 ...`` of a simulated workload's figure."""
    parts = [f"{k} {fmt_seconds(v[f'workload.{name}_s.{k}'])}" for k in ("mean", "p50", "p90",
                                                                       "p99")]  # fmt: skip
    return ", ".join(parts)


def _over_run(v: dict[str, Any], spec: ServeSpec) -> str:
    """A benchmark's served rate is over its run, drain included: say so, and the steady
    rate beside it."""
    if spec.requests is None:
        return ""
    return (
        f" over the run of {spec.requests:,} (drain included; "
        f"{v['workload.sustained_per_s']:,.3g} sustained)"
    )


def _time_rows(v: dict[str, Any], spec: ServeSpec, unit: str) -> list[tuple[str, str]]:
    if spec.simulated:
        per = fmt_rate(v["throughput.output_tokens_per_s_per_gpu"])
        return [("TTFT (queue + prefill)", _spread(v, "ttft")),
                ("TPOT (after the first)", _spread(v, "tpot")),
                ("end to end", _spread(v, "e2e")),
                ("served", f"{v['workload.requests_per_s']:,.3g} requests/s{_over_run(v, spec)}, "
                 f"{fmt_rate(v['throughput.output_tokens_per_s'])} output tokens/s "
                 f"({per} per {unit})")]  # fmt: skip
    return [
        (
            "TTFT (prefill)" if not spec.prefill_replicas else "TTFT (waves, mean)",
            fmt_seconds(v["time_s.ttft"]),
        ),
        (
            "TPOT (decode step)" if not spec.draft_tokens else "TPOT (speculative)",
            fmt_seconds(v["time_s.tpot"]) if spec.output > 1 else "none: one token, no decode",
        ),
        *_speculative_rows(v, spec),
        *_pool_rows(v, spec),
        ("end to end", fmt_seconds(v["time_s.e2e"])),
        (
            "output tokens/s",
            f"{fmt_rate(v['throughput.output_tokens_per_s'])} "
            f"({fmt_rate(v['throughput.output_tokens_per_s_per_gpu'])} per {unit})",
        ),
        (
            "decode FLOPs / bytes",
            f"{fmt_count(v['flops_per_device.decode_step'], 'FLOP')} / "
            f"{fmt_bytes(v['bytes_per_device.decode_step'])}",
        ),
    ]


def _speculative_rows(v: dict[str, Any], spec: ServeSpec) -> list[tuple[str, str]]:
    if not spec.draft_tokens:
        return []
    return [("speculative", f"{spec.draft_tokens} drafted tokens at acceptance "
             f"{spec.acceptance:g}: {v['speculative.tokens_per_cycle']:.2f} tokens per cycle "
             f"of {spec.draft_tokens} x {fmt_seconds(v['time_s.speculative.draft_step'])} "
             f"drafting + {fmt_seconds(v['time_s.speculative.verify_step'])} verifying "
             f"(a plain step: {fmt_seconds(v['time_s.decode_step.total'])})")]  # fmt: skip


def _pool_rows(v: dict[str, Any], spec: ServeSpec) -> list[tuple[str, str]]:
    if not spec.prefill_replicas:
        return []
    d = "disaggregated."
    prefill, decode = v[d + "prefill_requests_per_s"], v[d + "decode_requests_per_s"]
    slower = "prefill" if prefill < decode else "decode"
    fit = "" if v[d + "prefill_fits"] else "; a prefill replica does NOT fit"
    return [("prefill pool", f"{spec.prefill_replicas} x tp {spec.prefill_degree}: "
             f"{v[d + 'prefill_prompts_per_step']} prompts a step of "
             f"{fmt_seconds(v[d + 'prefill_step_s'])}, {prefill:,.2f} requests/s{fit}"),
            ("decode pool", f"{spec.dp} x tp {spec.tp}: {decode:,.2f} requests/s"),
            ("pools", f"{slower} limits the deployment; {v[d + 'prefill_replicas_to_balance']:.2f} "
             f"prefill replicas would match the decode pool; the cache hand-off takes "
             f"{fmt_seconds(v[d + 'handoff_s'])}")]  # fmt: skip


def _load(spec: ServeSpec, est: Any, lengths_: str) -> str:
    """The workload in the header line."""
    if spec.arrival == "poisson":
        return f"{spec.request_rate:g} requests/s at random of {lengths_}"
    if spec.concurrency:
        return f"{spec.concurrency:,} users of {lengths_}"
    if spec.request_rate:
        return (f"{spec.request_rate:g} requests/s of {lengths_}, "
                f"{est['continuous.in_flight']} in flight a replica")  # fmt: skip
    per = f" a replica ({spec.batch * spec.dp:,} in all)" if spec.dp > 1 else ""
    return f"{spec.batch:,} x {lengths_}{per}"


def _cmd_serve(args: argparse.Namespace) -> int:
    spec = spec_of({k: getattr(args, k, None) for k in SERVE_INPUTS})
    inp, out = spec.input, spec.output
    model = get_model(args.model) if args.hf_config is None else model_from_hf_config(
        args.hf_config)  # fmt: skip
    hw = get_hardware(args.hardware or DEFAULT_HARDWARE)
    output_defaulted = args.output is None and (args.context is None or args.input is None)
    defaulted = (output_defaulted, args.batch is None, args.engine is None)
    ans = answer(model, spec, hw, defaulted)
    est = ans.estimate
    if args.json:  # the text's verdict, assumptions and limit, and the spec priced
        print(to_json({"model": model.name, "hardware": hw.name, "input": inp,
                       "output": out, "context": spec.context, **ans.to_dict()},
                      indent=2))  # fmt: skip
        return 0
    pools = f", {spec.prefill_replicas} prefill x tp {spec.prefill_degree}" * bool(
        spec.prefill_replicas
    )
    stages = f", pp {spec.pp}" * (spec.pp > 1)
    lengths_ = f"({inp:,} in + {out:,} out)"
    load = _load(spec, est, lengths_)
    said = " (the default --hardware)" * (args.hardware is None)
    print(f"{model.name} on {spec.gpus} x {hw.name}{said} (tp {spec.tp}{stages}, dp {spec.dp}"
          f"{pools}): "
          f"{load}, {spec.precision} weights, {spec.kv_dtype} cache")  # fmt: skip
    unit = device_word(hw)
    rows = _rows(ans, spec, unit)
    width = max(len(k) for k, _ in rows)
    for key, shown in rows:
        print(f"  {key:<{width}}  {shown}")
    for note in est.notes:
        print(f"  note: {note}")
    return 0


def add_serve(sub) -> None:
    p = sub.add_parser("serve", help="serving: KV cache, memory, TTFT, TPOT, throughput")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help=f"preset: {', '.join(PRESETS)}")
    src.add_argument(
        "--hf-config",
        metavar="PATH",
        help="a Hugging Face config.json (its "
        "positions and rope scaling as the model was trained: Llama 3.1's 131,072)",
    )
    p.add_argument("--hardware", help=f"{', '.join(HARDWARE)} or .json (default "
                   f"{DEFAULT_HARDWARE})")  # fmt: skip
    p.add_argument("--context", type=int_arg, help="tokens a sequence holds at its end")
    p.add_argument("--input", type=int_arg, help="prompt tokens per request")
    p.add_argument("--output", type=int_arg, help=f"generated tokens (default {DEFAULT_OUTPUT})")
    p.add_argument("--batch", type=int_arg, help="requests served at once by each replica "
                   "(default 1; --concurrency and --request-rate are the whole deployment's); with "
                   "--request-rate or --concurrency the most in flight (default: the engine's "
                   "max_num_seqs)")  # fmt: skip
    p.add_argument("--precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, help="the cache's dtype (default: the "
                   "engine's rule: the weights' 16-bit dtype; TensorRT-LLM an fp8 cache beside "
                   "fp8 weights)")  # fmt: skip
    p.add_argument("--tp", type=int_arg, default=1)
    p.add_argument("--gpus", type=int_arg, help="devices of the deployment: replicas (--dp) "
                   "of tp x pp each")  # fmt: skip
    p.add_argument("--arrival", choices=ARRIVALS, help="together (the default): the "
                   "batch's prompts prefilled at once, then decoded (a static batch); "
                   "continuous: a continuously batched engine, prompts chunked into the "
                   "decode iterations (alone: kept full, steady state; with --request-rate: "
                   "its mean steady state; --concurrency is always simulated); poisson (the "
                   "default with "
                   "--request-rate): random arrivals, simulated")  # fmt: skip
    p.add_argument("--request-rate", type=float, help="requests/s arriving at the deployment "
                   "(over --dp): by default at random (Poisson), simulated request by request "
                   "with their queueing (mean and p50/p90/p99 TTFT, TPOT); with --arrival "
                   "continuous the mean steady state (Little's law; a rate past what the "
                   "deployment sustains refused)")  # fmt: skip
    p.add_argument("--concurrency", type=int_arg, help="a closed loop of this many users, each "
                   "sending its next request when its last ends (benchmarks' "
                   "--max-concurrency), simulated request by request")  # fmt: skip
    p.add_argument("--requests", type=int_arg, help="a benchmark of this many requests "
                   "(--request-rate, --concurrency), measured as vLLM's and SGLang's "
                   "bench_serving measure one: every request counted, throughput over the "
                   "run, the drain after the last arrival included (default: the steady "
                   "state)")  # fmt: skip
    p.add_argument("--length-spread", type=float, help="a simulated workload's spread of "
                   "request lengths: each prompt and output drawn uniformly within --input "
                   "and --output x (1 +- S), seeded (vLLM's --random-range-ratio S; "
                   "SGLang's default random dataset: S 1 around half its stated lengths; "
                   "default 0)")  # fmt: skip
    p.add_argument("--pp", type=int_arg, default=1, help="pipeline stages of a replica")
    p.add_argument("--dp", type=int_arg, help="replicas (default 1, or what --gpus leaves)")
    p.add_argument(
        "--ep",
        type=int_arg,
        default=1,
        help="expert parallelism: routed experts "
        "whole over ep devices spanning ep/tp replicas (attention data parallel)",
    )
    p.add_argument("--redundant-experts", type=lambda t: int_arg(t) if t != "0" else 0,
                   default=0, help="with --ep: extra copies of routed experts over the ep "
                   "devices (EPLB; DeepSeek-V3 serves 32): ep divides experts + them")  # fmt: skip
    p.add_argument("--batch-overlap", action="store_true", default=False, help="with --ep > "
                   "--tp: two micro-batches a step, each one's expert dispatch and combine "
                   "beside the other's compute (SGLang's --enable-two-batch-overlap, vLLM's "
                   "--enable-dbo); each reads the weights")  # fmt: skip
    p.add_argument("--block-size", type=int_arg, default=16, help="tokens per cache block")
    p.add_argument("--memory-utilization", type=float, help="share of device memory the "
                   "engine takes (default: the engine's, e.g. vLLM's 0.9)")  # fmt: skip
    p.add_argument("--engine", choices=list(ENGINES), help=f"the serving engine (default "
                   f"{DEFAULT_ENGINE}): " + "; ".join(f"{k}: {e.title}"
                                                      for k, e in ENGINES.items()))  # fmt: skip
    p.add_argument("--attention-kernel", choices=("auto", *KERNEL_FAMILIES), default="auto",
                   help="the fused-attention kernel a prompt runs (default auto: the engine's "
                   "on the device, e.g. FlashAttention-3 under vLLM V1 on Hopper)")  # fmt: skip
    p.add_argument("--fp8-scaling", choices=FP8_SCALINGS, default="auto",
                   help="how fp8 weights are scaled: tensor, or block (128 x 128, as "
                   "DeepSeek-V3's and Qwen3's fp8 checkpoints; default auto: the model's own "
                   "fp8 checkpoint's)")  # fmt: skip
    p.add_argument("--token-budget", type=int_arg, help="tokens an iteration may hold (vLLM's "
                   "max_num_batched_tokens; default: the engine's)")  # fmt: skip
    p.add_argument("--rope-scaling", type=float, default=1.0,
                   help="factor RoPE scaling stretches the positions by")  # fmt: skip
    p.add_argument(
        "--draft-tokens",
        type=lambda t: int_arg(t) if t != "0" else 0,
        default=0,
        help="speculative decoding: tokens a drafter proposes per step (0: off)",
    )
    p.add_argument(
        "--acceptance",
        type=float,
        help="with --draft-tokens: the chance a "
        "drafted token is accepted (stated, never assumed; DeepSeek-V3's MTP 0.85)",
    )
    p.add_argument("--prefill-replicas", type=int_arg, default=0, help="disaggregated "
                   "serving: replicas that only prefill and hand the cache to the --dp decode "
                   "replicas (0: each replica prefills its own)")  # fmt: skip
    p.add_argument("--prefill-tp", type=int_arg, help="tp of a prefill replica (default --tp)")
    p.add_argument("--draft-layers", type=int_arg, default=None, help="layers of the model's "
                   "shape the drafter runs per token (EAGLE head, MTP module: 1)")  # fmt: skip
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_serve)
