"""Serving workloads as benchmarks state them, simulated request by request: an open loop
of requests arriving at a rate (Poisson, as vLLM's ``benchmark_serving --request-rate`` and
MLPerf Inference's Server scenario send them), or a closed loop of C users, each sending its
next request when the last one ends (``--max-concurrency``, GenAI-Perf's concurrency).

One replica's engine runs iterations as vLLM V1's scheduler does (Orca, Yu et al. 2022;
chunked prefill, Agrawal et al. 2024, Sarathi-Serve): it admits waiting requests while it
runs fewer than ``batch`` and their caches fit; an iteration decodes one token of every
request whose prompt is in, and fills the rest of the engine's token budget
(``Engine.token_budget``) with chunks of prompts in admission order; a request's first token
comes at the end of the iteration that finishes its prompt. Each iteration is priced by the
same step model as ``serve`` (:func:`costmodel.serving.continuous.pricer`: the decodes at
their mean cache, the prompt tokens beside them), so a request's TTFT includes its wait in
the queue and behind running iterations, and its TPOT the prompts that other requests chunk
into its decode iterations (as Vidur, Agrawal et al. 2024, simulates over profiled
operators). Arrivals are drawn from a seeded generator: the same question gives the same
numbers. The first requests warm the engine up and are not counted: the first tenth, and
under a closed loop the first wave of users, who all send at once (a loop with no more
requests than users is one burst, counted whole, as a benchmark of that many prompts
measures it). The rate served is the steady one (:func:`_served`): under a closed loop the
users over the mean end to end (Little's law), under an open loop what is offered below
capacity and the capacity above it; the drain after the last arrival is not counted. A
benchmark of a stated number of requests (``ServeSpec.requests``) is measured as
``bench_serving`` measures one: every request counted, its throughput the requests over the
run, first arrival to last completion (its drain included); the steady rate stays beside it.
Units: seconds, requests/s, tokens/s.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from costmodel.serving.continuous import pricer
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import STEADY_REQUESTS, ServeSpec

MAX_TOKENS = 2_000_000
"""The most output tokens one replica decodes in a simulation (requests x output): at one
sequence an iteration, about 12 s of work on one core."""
CONTEXT_BUCKET = 64
"""Decodes' mean cache rounded to this many tokens to share priced iterations."""
WARMUP = 0.1
"""Share of the requests, the first to arrive, not counted (the engine filling up)."""


@dataclass
class _Request:
    arrival: float
    input: int
    output: int
    prefilled: int = 0
    generated: int = 0
    first: float = math.nan
    done: float = math.nan


def lengths(spec: ServeSpec, rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    """(prompt, output) tokens of ``n`` requests: the stated ones, or under
    ``ServeSpec.length_spread`` s each drawn uniformly among the whole numbers within the
    stated x (1 +- s), at least 1 (as benchmarks' random datasets draw them), after the
    arrivals from the same seeded generator."""
    if not spec.length_spread:
        return [(spec.input, spec.output)] * n

    def draw(mean: int) -> np.ndarray:
        low = max(1, round(mean * (1 - spec.length_spread)))
        return rng.integers(low, max(low, round(mean * (1 + spec.length_spread))) + 1, n)

    return list(zip(draw(spec.input).tolist(), draw(spec.output).tolist(), strict=True))


def simulate(
    model: ModelSpec, spec: ServeSpec, hw: Hardware, step: Any, phase: Any, attention_rate: float,
    requests: int | None, seed: int = 0, capacity: float = math.inf,
) -> dict[str, Any]:  # fmt: skip
    """TTFT, TPOT and end to end (mean, p50, p90, p99) and throughput of ``requests``
    requests over the deployment (module docstring): at ``spec.request_rate`` requests/s
    (Poisson over ``dp`` replicas) or ``spec.concurrency`` users (``dp`` share them),
    ``spec.batch`` at most in flight a replica. ``step`` and ``phase`` are
    ``estimate.decode_step`` and ``estimate._phase``; ``attention_rate`` the prompt
    attention kernel's FLOP/s; ``capacity`` the requests/s the deployment sustains in
    steady state (``serving.continuous``): an open loop serves no more, however few requests
    the window holds (too few to build the queue a rate past it makes). ``requests`` None:
    the steady state of ``STEADY_REQUESTS``; a number: a benchmark of that many
    (``ServeSpec.requests``)."""
    benchmark = requests is not None
    requests = STEADY_REQUESTS if requests is None else requests
    per_replica = max(1, math.ceil(requests / spec.dp))
    if per_replica * spec.output > MAX_TOKENS:
        raise SpecError("requests", f"requests ({requests:,}) x output ({spec.output:,}) per "
                        f"replica must be <= {MAX_TOKENS:,} tokens to simulate")  # fmt: skip
    seconds = _iteration_seconds(model, spec, hw, step, phase, attention_rate)
    rng = np.random.default_rng(seed)
    if spec.request_rate is not None:
        gaps = rng.exponential(spec.dp / spec.request_rate, per_replica)
        sizes = lengths(spec, rng, per_replica)
        reqs = [_Request(float(t), *size) for t, size in zip(np.cumsum(gaps), sizes, strict=True)]
        users = 0
    else:
        users = users_of(spec)
        sizes = lengths(spec, rng, per_replica)
        reqs = [_Request(0.0, *sizes[i]) for i in range(min(users, per_replica))]
    clock = _run(reqs, spec, seconds, users, sizes)
    return _summary(reqs, spec, clock, users, capacity, benchmark)


def _iteration_seconds(model, spec, hw, step, phase, rate):
    """``seconds(decodes, mean cache, prompt tokens)`` of one iteration, each distinct
    (decodes, cache bucket, prompt tokens) priced once."""
    price = pricer(model, spec, hw, phase, rate)

    @cache
    def decode(b: int, cached: int) -> dict[str, Any]:
        return step(model, replace(spec, batch=b, input=cached, output=1), hw)

    @cache
    def seconds(b: int, cached: int, tokens: int) -> float:
        d = decode(max(b, 1), max(cached, 1))
        if b == 0:  # prompts alone: the weights still read once
            d = {**d, "linear_flops": 0.0, "core_s": 0.0, "kv_bytes": 0.0}
        return float(price(d, b, tokens)["total"])

    return lambda b, cached, tokens: seconds(
        b, CONTEXT_BUCKET * max(1, round(cached / CONTEXT_BUCKET)), tokens
    )


def _run(
    reqs: list[_Request], spec: ServeSpec, seconds: Any, users: int, sizes: list[tuple[int, int]]
) -> float:
    """Iterate the engine until ``len(sizes)`` requests are done; a closed loop appends
    each user's next request (the next of ``sizes``) as its last one ends. Returns the
    clock."""
    total = len(sizes)
    waiting, running, clock, nxt = deque(), [], 0.0, 0
    while nxt < len(reqs) or waiting or running:
        while nxt < len(reqs) and reqs[nxt].arrival <= clock:
            waiting.append(reqs[nxt])
            nxt += 1
        while waiting and len(running) < spec.batch:
            running.append(waiting.popleft())
        if not running:
            clock = reqs[nxt].arrival  # idle until the next arrival
            continue
        decoding = [r for r in running if r.prefilled == r.input]
        budget, chunks = spec.token_budget - len(decoding), []
        for r in running:
            if r.prefilled < r.input and budget > 0:
                take = min(r.input - r.prefilled, budget)
                chunks.append((r, take))
                budget -= take
        cached = sum(r.input + r.generated for r in decoding) / max(1, len(decoding))
        clock += seconds(len(decoding), cached, sum(t for _, t in chunks))
        for r in decoding:
            r.generated += 1
        for r, take in chunks:
            r.prefilled += take
            if r.prefilled == r.input:
                r.first, r.generated = clock, 1
        for r in [r for r in running if r.generated >= r.output]:
            r.done = clock
            running.remove(r)
            if users and len(reqs) < total:  # the user sends its next request now
                reqs.append(_Request(clock, *sizes[len(reqs)]))
    return clock


def _summary(
    reqs: list[_Request], spec: ServeSpec, clock: float, users: int = 0,
    capacity: float = math.inf, benchmark: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Mean and p50/p90/p99 of TTFT, TPOT (after the first token) and end to end over the
    counted requests (module docstring: all of a benchmark's), the requests and tokens/s
    the deployment served: its steady rate (:func:`_served`), or a benchmark's, its
    requests over its run, first arrival to last completion; the means are the answer's
    ``time_s.*`` and its throughput."""
    skip = int(WARMUP * len(reqs))
    if users:  # a closed loop: its first wave is a burst, unless it is the whole workload
        skip = 0 if len(reqs) <= users else max(skip, users)
    steady = reqs[skip:]
    counted = reqs if benchmark else steady
    ttft = np.array([r.first - r.arrival for r in counted])
    e2e = np.array([r.done - r.arrival for r in counted])
    tpot = np.array([(r.done - r.first) / (r.output - 1) if r.output > 1 else 0.0
                     for r in counted])  # fmt: skip
    out: dict[str, Any] = {"workload.requests": len(reqs), "workload.counted": len(counted)}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"workload.{name}_s.mean"] = float(values.mean())
        for q in (50, 90, 99):
            out[f"workload.{name}_s.p{q}"] = float(np.percentile(values, q))
    asked = None if users else spec.request_rate / spec.dp
    sustained = spec.dp * _served(reqs, steady, users, asked)
    if not users:  # a window too short to build the queue still serves at most capacity
        sustained = min(sustained, capacity)
        out["workload.capacity_per_s"] = capacity
    out["workload.sustained_per_s"] = sustained
    served = sustained
    if benchmark:  # as bench_serving divides: completed over the run's duration
        served = spec.dp * len(reqs) / (clock - min(r.arrival for r in reqs))
        served = min(served, capacity) if not users else served
    out["workload.requests_per_s"] = served
    if not users:  # an open loop: the rate asked (the seeded draw's is near it)
        out["workload.offered_per_s"] = spec.request_rate
    out_mean = float(np.mean([r.output for r in counted]))  # the counted requests' lengths
    in_mean = float(np.mean([r.input for r in counted]))
    tokens = served * out_mean
    out.update({"time_s.ttft": out["workload.ttft_s.mean"], "time_s.tpot":
                out["workload.tpot_s.mean"], "time_s.e2e": out["workload.e2e_s.mean"],
                "throughput.output_tokens_per_s": tokens,
                "throughput.total_tokens_per_s": tokens * (in_mean + out_mean) / out_mean,
                "throughput.output_tokens_per_s_per_gpu": tokens / spec.dp / spec.tp})  # fmt: skip
    return out


KEEPS_UP = 0.97
"""An open loop keeps up where its requests complete at this share of the rate they
arrived at in the seeded draw or more (the rest is the draw's noise over the window)."""


def _served(
    reqs: list[_Request], counted: list[_Request], users: int, asked: float | None = None
) -> float:
    """Requests a replica completes per second in steady state. A closed loop of ``users``:
    users over the mean end to end (Little's law; no think time). An open loop at ``asked``
    requests/s a replica: that rate where the deployment keeps up (its completions keep
    pace with the seeded draw's arrivals, whose own rate is only near the one asked: a
    window of a few hundred Poisson arrivals is off by several percent), else the rate its
    counted requests complete at, first to last: its capacity, as the queue grows. A burst
    (every request at once): the requests over the time to the last one done."""
    if users and len(reqs) > users:
        return users / float(np.mean([r.done - r.arrival for r in counted]))
    done = sorted(r.done for r in counted)
    if not users and len(done) > 1 and done[-1] > done[0]:
        completing, arriving = (len(done) - 1) / (done[-1] - done[0]), offered(reqs, counted)
        if asked is not None and completing >= KEEPS_UP * arriving:
            return asked
        return min(completing, arriving, asked or math.inf)
    window = done[-1] - min(r.arrival for r in counted)
    return len(counted) / window if window > 0 else math.inf


def offered(reqs: list[_Request], counted: list[_Request]) -> float:
    """Requests a replica received per second over the counted arrivals' span (a seeded
    Poisson draw's rate, near the one asked for)."""
    start, end = min(r.arrival for r in counted), max(r.arrival for r in reqs)
    return (len(counted) - 1) / (end - start) if end > start else math.inf


def users_of(spec: ServeSpec) -> int:
    """A closed loop's users per replica."""
    return max(1, math.ceil((spec.concurrency or 0) / spec.dp))


SERVED = 0.95
"""The least share of an open loop's offered rate a steady state serves (:func:`overloaded`;
it was 0.9, and 4.61 requests/s served of 5 offered, TTFT p99 16 s and growing, read as
fitting: issue 60's app probe)."""


def overloaded(out: Mapping[str, Any]) -> bool:
    """Whether an open loop (its answer's ``out``) is offered more than it can serve: more
    than its capacity (the saturated deployment's requests/s: its queue then grows without
    bound, however few requests a run simulates), or more than the simulation served: under
    ``SERVED`` of the rate, past the sampling noise of a steady state (a rate over 900
    counted Poisson arrivals is within 3.3 % of the offered one at one standard deviation),
    where the queue grew through the run."""
    if "workload.offered_per_s" not in out:
        return False
    offered = out["workload.offered_per_s"]
    over = offered > out.get("workload.capacity_per_s", math.inf)
    return over or out["workload.sustained_per_s"] < SERVED * offered


def note(spec: ServeSpec, out: dict[str, Any]) -> str:
    """What a simulated workload was, in words, and where its figures are not a steady
    state: an offered rate above what the deployment serves (its queue grows without bound,
    TTFT with the requests simulated), a closed loop of few requests per user."""
    load = (f"{spec.request_rate:g} requests/s arriving at random (Poisson)"
            if spec.request_rate is not None else
            f"{spec.concurrency:,} users, each sending a request as its last ends")  # fmt: skip
    skipped = out["workload.requests"] - out["workload.counted"]
    simulated = out["workload.requests"] * spec.dp
    if spec.requests is not None:
        what = (f"a benchmark of {simulated:,} requests, {load}, every one counted, its "
                "throughput over its run, first arrival to last completion (as vLLM's and "
                "SGLang's bench_serving measure it)")  # fmt: skip
    else:
        what = (f"the steady state: {simulated:,} requests simulated, {load}, the first "
                f"{skipped * spec.dp:,} and the drain after the last arrival not counted "
                "(--requests N: a benchmark of N)")  # fmt: skip
    if spec.length_spread:
        what += (f"; each request's lengths drawn within {spec.input:,} and {spec.output:,} "
                 f"x (1 +- {spec.length_spread:g})")  # fmt: skip
    text = (
        f"{what}; at most {min(spec.batch, out.get('max_batch', spec.batch)):,} in flight a "
        "replica (the batch and what the cache holds), prompts chunked into iterations "
        f"of {spec.token_budget:,} tokens; decode at each iteration's mean cache (seed 0: the "
        "same question, the same numbers)"
    )
    served = out["workload.sustained_per_s"]
    if overloaded(out):
        text += (f"; OVERLOADED: {spec.request_rate:g} requests/s offered, "
                 f"{served:.3g} served: the queue grows without bound, so TTFT grows with "
                 "--requests; lower --request-rate or add replicas (--dp)")  # fmt: skip
    elif (spec.concurrency is not None and out["workload.requests"] > 1
          and out["workload.requests"] <= users_of(spec)):  # fmt: skip
        text += "; every request sent at once (no more requests than users): one burst"
    elif spec.concurrency is not None and out["workload.requests"] < 10 * users_of(spec):
        text += ("; fewer than 10 requests a user: the figures move with --requests until "
                 "the users fall out of step")  # fmt: skip
    return text
