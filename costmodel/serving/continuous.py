"""Continuous batching in steady state: an engine keeps ``batch`` sequences in flight and, in
every iteration, decodes one token for each and prefills chunks of the prompts that replace
the ones finishing (Orca, Yu et al. 2022; chunked prefill piggybacking on decode, Sarathi-
Serve, Agrawal et al. 2024; vLLM V1 and TensorRT-LLM's in-flight batching).

- **An iteration** holds B decode tokens and, on average, the B / output prompts that
  start per iteration (as many finish), B x input / output prompt tokens, within the
  engine's token budget (``Engine.token_budget``: vLLM V1's ``max_num_batched_tokens``,
  TensorRT-LLM's ``max_num_tokens``). Where the prompts need more than the budget
  leaves, the batch that can be kept full is budget / (1 + input / output).
- **Its time** is the matmuls' roofline over both (the decode step's and the prompt tokens'
  FLOPs, the weights read once for all) followed by the attention core's (the decode queries
  over every cached entry, the prompts over themselves at the fused kernel's rate; the cache
  read and written), as ``estimate._phase`` runs them; tp's all-reduces over all of the
  iteration's tokens.
- **At a request rate** λ (``ServeSpec.request_rate``) the engine holds the fewest sequences
  B that the rate keeps in flight, B = λ / dp x end to end at B (Little's law, Little 1961:
  the mean number in a system is its arrival rate times the mean time spent in it), at most
  ``batch`` and what fits; it serves λ requests/s. A rate above what the largest batch
  sustains has no steady state and is refused; the waiting of random arrivals below it is
  not modelled (means only, no percentiles).
- TPOT is an iteration; output tokens/s dp x B per iteration; TTFT the iterations a prompt's
  chunks take at the budget the decodes leave (at least one), each holding the prompt's
  chunk or the steady state's prompt tokens, whichever is more; end to end TTFT + (output
  − 1) x TPOT (at a request rate, output tokens/s is λ x output). Without a rate the engine is
  always full: an offline run, or clients that send their next request as the last one ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from costmodel.serving import terms
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import DTYPE_BYTES, ServeSpec
from costmodel.symbols.algebra import by_symbol
from costmodel.symbols.core import B, T, Y, values_for


def kept_batch(spec: ServeSpec) -> int:
    """Sequences the engine keeps in flight: ``batch``, or as many as leave the token budget
    room for the prompts that replace the finishing ones, B x (1 + input / output) tokens
    an iteration."""
    most = math.floor(spec.token_budget / (1 + spec.input / spec.output))
    return max(1, min(spec.batch, most))


def pricer(
    model: ModelSpec, spec: ServeSpec, hw: Hardware, phase: Any, attention_rate: float
) -> Callable[[dict[str, Any], int, float], dict[str, float]]:
    """``seconds(decode, b, tokens)``: an iteration of ``b`` decodes (``decode``, their
    decode step: ``estimate.decode_step``) and ``tokens`` prompt tokens (their share of
    whole prompts' attention and cache), by ``phase`` (``estimate._phase``)."""
    vals = {**values_for(model), Y: spec.tp}
    prompt = by_symbol({**vals, B: 1, T: spec.input})
    core = float(terms.prefill_core_flops(model).xreplace(prompt))
    kv = float(terms.kv_elements(model).xreplace(prompt))
    per_token = DTYPE_BYTES[spec.kv_dtype] * kv / spec.input

    def seconds(decode: dict[str, Any], b: int, tokens: float) -> dict[str, float]:
        prompts = tokens / spec.input
        flops = float(terms.linear_flops(model, tokens, prompts).xreplace(by_symbol(vals)))
        routed = float(terms.expert_flops(model, tokens).xreplace(by_symbol(vals)))
        cores = decode["core_s"] + prompts * core / attention_rate
        cache = decode["kv_bytes"] + tokens * per_token
        experts = (decode["expert_flops"] + routed, decode["expert_bytes"])
        return phase((decode["linear_flops"] + flops, decode["weight_bytes"]), (cores, cache),
                     b + tokens, model, spec, hw, hw.decode_bandwidth(),
                     sequences=b + math.ceil(prompts), routed=experts)  # fmt: skip

    return seconds


def iteration(
    model: ModelSpec, spec: ServeSpec, hw: Hardware, step: Any, phase: Any, attention_rate: float
) -> dict[str, Any]:
    """The steady state (module docstring) of ``spec.batch`` sequences (at most
    :func:`kept_batch`): ``step`` is the decode step function (``estimate.decode_step``),
    ``phase`` the roofline (``estimate._phase``)."""
    b = spec.batch  # the caller's batch is already the kept one (kept_batch)
    decode = step(model, spec, hw)
    price = pricer(model, spec, hw, phase, attention_rate)

    def seconds(tokens: float) -> dict[str, float]:
        return price(decode, b, tokens)

    tokens = b * spec.input / spec.output  # the prompts that start as others finish
    steady = seconds(tokens)
    t = steady["total"]
    chunk = min(spec.input, max(spec.token_budget - b, 1))
    ttft = math.ceil(spec.input / chunk) * seconds(max(tokens, chunk))["total"]
    out_rate = spec.dp * b / t
    return {
        "continuous.prompt_tokens_per_iteration": tokens,
        **{f"time_s.iteration.{k}": v for k, v in steady.items()},
        "time_s.ttft": ttft, "time_s.tpot": t, "time_s.e2e": ttft + (spec.output - 1) * t,
        "throughput.output_tokens_per_s": out_rate,
        "throughput.total_tokens_per_s": out_rate * (spec.input + spec.output) / spec.output,
        "throughput.output_tokens_per_s_per_gpu": out_rate / spec.dp / spec.tp,
    }  # fmt: skip


def in_flight(spec: ServeSpec, e2e: Callable[[int], float], most: int) -> tuple[int, float]:
    """(sequences a replica holds in flight at ``spec.request_rate``, the requests/s the
    deployment sustains at ``most``): the fewest B in 1..most with B >= λ / dp x ``e2e(B)``
    (module docstring; ``e2e`` grows with B, so a bisection finds it). A rate above the
    deployment's is refused, naming the field."""
    per_replica = spec.request_rate / spec.dp
    capacity = spec.dp * most / e2e(most)
    if spec.request_rate > capacity:
        raise SpecError("request_rate", f"request_rate ({spec.request_rate:g}/s) exceeds the "
                        f"{capacity:,.3g} requests/s the deployment sustains ({spec.dp} x "
                        f"{most} sequences in flight, the most that fit and the batch "
                        "allows)")  # fmt: skip
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mid >= per_replica * e2e(mid) else (mid + 1, hi)
    return lo, capacity


def notes(spec: ServeSpec, asked: int, out: dict[str, Any]) -> list[str]:
    """What the steady state assumes: at a rate, the sequences Little's law keeps in flight
    and the capacity; without one, why fewer than the ``asked`` batch stay in flight."""
    if spec.request_rate:
        return [f"{spec.request_rate:g} requests/s keep {spec.batch} sequences in flight a "
                f"replica (Little's law); the deployment sustains up to "
                f"{out['continuous.capacity_requests_per_s']:,.3g} requests/s; the waiting of "
                "random arrivals is not modelled (--arrival poisson simulates it)"]  # fmt: skip
    if spec.batch >= asked:
        return []
    budget = kept_batch(replace(spec, batch=asked))
    why = (f"the prompts replacing the finishing ones need the rest of the "
           f"{spec.token_budget:,}-"
           "token iteration budget" if spec.batch == budget
           else "the cache holds no more (a request is admitted as blocks free)")  # fmt: skip
    return [f"continuous batching keeps {spec.batch} of {asked} sequences in flight: {why}"]
