"""What a serving answer says beside its numbers, the same in the CLI, the app and the API:
what limits it (``limited_by``: the largest part of a decode step or an iteration, the
prefill pool of a disaggregated deployment) and every setting it assumes, a default named
with its flag (``assumptions``)."""

from __future__ import annotations

import math
from typing import Any

from costmodel.specs.engines import Engine
from costmodel.specs.serving import ServeSpec

PARTS = {
    "matmuls": "the matmuls",
    "experts": "the routed experts (one grouped kernel)",
    "attention": "attention over the cache",
    "comm": "communication (tp all-reduces)",
    "overhead": "per-layer step overhead",
    "host": "the host (dispatch, the engine's scheduling and output processing)",
}


def limited_by(v: dict[str, Any], output: int | None = None) -> str:
    """The pool that limits a disaggregated deployment where it is the prefill pool; the
    prefill where a request generates one token (``output`` 1: no decode step); else the
    decode step's (a continuous engine's iteration's) largest part: its dense matmuls, its
    routed experts' grouped kernel or its attention, each compute- or memory-bound (a
    roofline per kernel), its exposed all-reduces, overhead or host; and what a step's bytes
    are."""
    if output == 1:
        return "the prefill: one token is generated, so no decode step follows (TTFT is all)"
    d = "disaggregated."
    if v.get(d + "prefill_requests_per_s", float("inf")) < v.get(d + "decode_requests_per_s", 0):
        return (f"the prefill pool: {v[d + 'prefill_requests_per_s']:,.2f} requests/s against "
                f"the decode pool's {v[d + 'decode_requests_per_s']:,.2f} (--prefill-replicas "
                f"{math.ceil(v[d + 'prefill_replicas_to_balance'])} keeps up)")  # fmt: skip
    kind = "iteration" if "time_s.iteration.total" in v else "decode_step"
    t = {k.rsplit(".", 1)[1]: x for k, x in v.items() if k.startswith(f"time_s.{kind}.")}
    bound = {k: "compute" if t[f"{k}_compute"] >= t[f"{k}_memory"] else "memory"
             for k in ("matmuls", "experts", "attention")}  # fmt: skip
    parts = {k: (max(t[f"{k}_compute"], t[f"{k}_memory"]) if k in bound else t[k]) for k in PARTS}
    part = max(parts, key=parts.__getitem__)
    what = "an iteration (decodes and prompt chunks)" if kind == "iteration" else "decode"
    named = PARTS[part]
    if part == "comm" and v.get("bytes_per_device.decode_step_experts"):  # dispatch too
        named = "communication (tp all-reduces, expert dispatch and combine)"
    how = f", {bound[part]}-bound" if part in bound else ""
    kv = v["bytes_per_device.decode_step_kv"] / v["bytes_per_device.decode_step"]
    held = v.get("workload.in_flight")
    load = "" if held is None else f" at the mean {held:,} in flight a replica"
    return (
        f"{what}{load}: {named}{how} ({parts[part] / t['total']:.0%} of a step); its "
        f"bytes {1 - kv:.0%} weights, {kv:.0%} KV cache"
    )


def assumptions(
    spec: ServeSpec,
    output_defaulted: bool = False,
    batch_defaulted: bool = False,
    engine_defaulted: bool = False,
) -> str:
    """Every setting the numbers assume, given or default (a default named with its flag)."""
    kind = spec.engine_kind
    output = f"{spec.output} generated tokens (default; --output), " if output_defaulted else ""
    loaded = spec.request_rate is not None or spec.concurrency
    if batch_defaulted:
        output += (f"at most {spec.batch} in flight (the engine's default; --batch), "
                   if loaded else "one request at a time (default; --batch), ")  # fmt: skip
    elif loaded:  # a cap the user set binds a load: said beside the others
        output += f"at most {spec.batch:,} in flight a replica (--batch), "
    return (f"{output}engine {kind.title} ({_said(engine_defaulted)}--engine): "
            f"{_host(kind)}; {spec.precision} weights{_scaling(spec)}, {spec.kv_dtype} cache in "
            f"blocks of "
            f"{spec.block_size}; "
            f"tp {spec.tp}, pp {spec.pp}, dp {spec.dp}{_experts(spec)}; the engine takes "
            f"{spec.memory_utilization:g} of each device; {_budget(spec)}; "
            f"{_arrival(spec)}{_drafting(spec)}")  # fmt: skip


def _scaling(spec: ServeSpec) -> str:
    """How fp8 weights are scaled, as given or by default (the model's own checkpoint's)."""
    if spec.precision != "fp8":
        return ""
    if spec.fp8_scaling == "auto":
        return " scaled as the model's own fp8 checkpoint (default; --fp8-scaling)"
    return f" with {spec.fp8_scaling} scales (--fp8-scaling)"


def _budget(spec: ServeSpec) -> str:
    """The engine's tokens an iteration, and where it does not apply: a static batch's
    prompts are priced as prefilled together (its TTFT does not chunk them)."""
    if spec.token_budget is None:
        return "whole prompts a step (up to the model's context)"
    said = f"at most {spec.token_budget:,} tokens an iteration"
    if spec.arrival == "together" and spec.batch * spec.input > spec.token_budget:
        said += (" for prompts arriving over time, not applied to this batch's prefill: its "
                 "prompts are priced prefilled together (--arrival continuous, --concurrency "
                 "or --request-rate chunk them)")  # fmt: skip
    return said


def _said(default: bool) -> str:
    return "default; " if default else ""


def _host(kind: Engine) -> str:
    """What the engine's host costs an iteration, in words."""
    if not kind.fused:
        return "elementwise ops and kernel launches priced op by op"

    def cost(fixed: float, per: float) -> str:
        return " + ".join([f"{fixed * 1e3:.3g} ms"] * bool(fixed)
                          + [f"{per * 1e6:.3g} us a sequence"] * bool(per))  # fmt: skip

    parts = [f"{cost(fixed, per)} {what}" for what, fixed, per in (
        ("waited for", kind.step_s, kind.seq_s),
        ("beside the device", kind.async_step_s, kind.async_seq_s)) if fixed or per]  # fmt: skip
    return f"host per iteration {', '.join(parts)}" if parts else "host time not priced"


def _experts(spec: ServeSpec) -> str:
    if spec.ep == 1:
        return ""
    if spec.ep == spec.tp:
        return f", ep {spec.ep} (whole experts over each replica's tp ranks)"
    flag = spec.engine_kind.batch_overlap_flag
    overlap = f", in two micro-batches whose all-to-alls overlap ({flag})" * spec.batch_overlap
    return (
        f", ep {spec.ep}: whole experts over {spec.ep // spec.tp} replicas' tp ranks, "
        f"tokens dispatched to them and combined back (uniform routing){overlap}"
    )


def _arrival(spec: ServeSpec) -> str:
    if spec.simulated:
        load = (f"requests arrive at random (Poisson) at {spec.request_rate:g}/s"
                if spec.request_rate is not None else
                f"a closed loop of {spec.concurrency:,} users")  # fmt: skip
        other = "; --arrival continuous: the mean steady state" * (spec.request_rate is not None)
        count = ("the steady state of many" if spec.requests is None else
                 f"a benchmark of {spec.requests:,}")  # fmt: skip
        return (f"{load}, {count} simulated one by one through continuous batching "
                f"(queueing included{other})")  # fmt: skip
    if spec.request_rate:
        return (f"requests arrive at {spec.request_rate:g}/s into continuous batching (at most "
                f"{spec.batch} in flight a replica; mean steady state, no queueing of random "
                "arrivals)")  # fmt: skip
    if spec.arrival == "continuous":
        return ("continuous batching kept full, prompts chunked into the decode iterations "
                "(steady state; no arrival gaps or queueing)")  # fmt: skip
    if spec.prefill_replicas:
        return ("prompts prefilled apart in waves of the prefill pool (the batch's arrive "
                "together) and their cache sent over the network")  # fmt: skip
    return "the batch's prompts arrive together"


def _drafting(spec: ServeSpec) -> str:
    if not spec.draft_tokens:
        return "; no speculative decoding"
    return (
        f"; a {spec.draft_layers}-layer drafter of the model's shape proposes "
        f"{spec.draft_tokens} tokens a step, each accepted with probability "
        f"{spec.acceptance:g} (chain drafts, no tree)"
    )
