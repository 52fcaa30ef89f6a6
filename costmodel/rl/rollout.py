"""A synchronous rollout: every sequence of the step handed to the rollout engines at once,
each engine generating its share until its longest response ends (GRPO and PPO rollouts in
verl, NeMo RL and OpenRLHF: ``LLM.generate`` over the whole batch).

- **Response lengths**: lognormal with mean ``output`` and log-space spread ``sigma``
  (0: every response ``output`` tokens), cut at ``max_output`` (the sampler's
  ``max_new_tokens`` or the context left by ``max_model_len``: the engine stops a sequence
  there), read at evenly spaced quantiles, no random draw: the k-th of n at (k - 1/2) / n.
  The engine holding the longest response sets the rollout's time, so each engine is given
  every ``replicas``-th of the sorted lengths, the first engine the longest.
- **An engine** is vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``): it admits
  waiting sequences while it runs fewer than its engine's ``max_seqs`` and their prompts fit
  its KV memory; when the running ones' next tokens do not fit, it preempts the most
  recently admitted, which later prefill their prompt and what they had generated again
  (V1's recompute preemption).
- **An iteration** decodes one token of every running sequence: costmodel.serving's decode
  step (``costmodel.serving.estimate.decode_step``) at that batch and their mean context,
  priced once per ``CHUNK`` iterations at most; the prompts admitted in it add their
  prefill (``serve``'s prefill of that many prompts).
- The rollout's seconds are its slowest engine's: the sum of its iterations. Not modelled:
  sampling beyond the decode step's logits, detokenisation, and the engine's sleep and
  wake-up around the rollout in a colocated step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from functools import cache
from statistics import NormalDist
from typing import Any

import numpy as np

from costmodel.serving import serve
from costmodel.serving.estimate import decode_step
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import ServeSpec

CHUNK = 64
"""Decode iterations priced at one batch at most, at their middle context (exact while an
iteration's seconds grow linearly with the cache it reads)."""
CONTEXT_BUCKET = 32
"""Mean contexts are rounded to this many tokens to share priced decode steps (each
sequence's cache read at most 16 tokens off)."""


@dataclass(frozen=True)
class Rollout:
    """One engine's share of a rollout: seconds (decode and prefill), the iterations it
    ran, the most sequences it ran at once, preemptions, and its responses' lengths."""

    seconds: float
    decode_s: float
    prefill_s: float
    iterations: int
    peak_running: int
    preemptions: int
    mean_output: float
    longest: int


def response_lengths(n: int, mean: float, sigma: float, cap: int) -> np.ndarray:
    """``n`` response lengths, longest first: lognormal quantiles (module docstring) whose
    mean after the cut at ``cap`` is ``mean`` (what a run reports), as integers in [1, cap]."""
    if sigma == 0:
        return np.full(n, max(1, min(round(mean), cap)), dtype=np.int64)
    normal = NormalDist()
    z = np.array([normal.inv_cdf((k + 0.5) / n) for k in range(n)])
    mu = math.log(mean) - sigma**2 / 2
    for _ in range(50):  # the cut lowers the mean: raise the median until it is ``mean``
        got = np.clip(np.exp(mu + sigma * z), 1, cap).mean()
        if abs(got / mean - 1) < 1e-4 or got >= cap:
            break
        mu += math.log(mean / got)
    lengths = np.clip(np.rint(np.exp(mu + sigma * z)), 1, cap).astype(np.int64)
    return np.sort(lengths)[::-1]


def engine_share(lengths: np.ndarray, replicas: int) -> np.ndarray:
    """The slowest engine's lengths: every ``replicas``-th of the sorted ``lengths`` from
    the longest."""
    return lengths[::replicas]


def kv_capacity_tokens(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> int:
    """Tokens of cache one engine's memory share holds beside its weights and prefill
    workspace (``serve``'s memory)."""
    est = serve(model, replace(spec, batch=1), hw)
    return int(est["memory_bytes_per_device.kv_room"] // est["kv_bytes_per_token"])


def simulate(
    model: ModelSpec, spec: ServeSpec, hw: Hardware, lengths: np.ndarray, capacity: int
) -> Rollout:
    """One engine generating responses of ``lengths`` to prompts of ``spec.input`` tokens
    (module docstring) in ``capacity`` tokens of cache (:func:`kv_capacity_tokens`);
    ``spec``'s tp, precision and memory share are the engine's."""
    prompt, target = spec.input, np.asarray(lengths, dtype=np.int64)
    if prompt + int(target.max()) > capacity:
        raise SpecError("max_output", f"max_output: a {prompt:,}-token prompt and its "
                        f"{int(target.max()):,}-token response do not fit the engine's cache of "
                        f"{capacity:,} tokens; lower max_output or raise rollout_memory or "
                        "rollout_tp")  # fmt: skip
    step, prefill = _step_pricer(model, spec, hw), _prefill_pricer(model, spec, hw)
    waiting = deque(range(len(target)))  # indices, admission order
    done = np.zeros(len(target), dtype=np.int64)  # tokens generated so far
    running = np.zeros(0, dtype=np.int64)
    decode_s = prefill_s = 0.0
    held = iterations = peak = preemptions = 0
    while waiting or len(running):
        admitted = []
        while (waiting and len(running) + len(admitted) < spec.engine_kind.max_seqs
               and held + prompt + done[waiting[0]] < capacity):  # fmt: skip
            admitted.append(waiting.popleft())
            held += prompt + int(done[admitted[-1]])
        if admitted:
            prefill_s += prefill(len(admitted), prompt + round(float(done[admitted].mean())))
            running = np.concatenate([running, admitted])
        while (capacity - held) < len(running) and len(running) > 1:  # preempt the newest
            waiting.appendleft(int(running[-1]))
            held -= prompt + int(done[running[-1]])
            running, preemptions = running[:-1], preemptions + 1
        room = (capacity - held) // len(running)
        k = max(1, min(CHUNK, int((target[running] - done[running]).min()), room))
        context = prompt + float(done[running].mean()) + k / 2
        decode_s += k * step(len(running), context)
        iterations, peak = iterations + k, max(peak, len(running))
        done[running] += k
        held += k * len(running)
        finished = done[running] >= target[running]
        held -= int((prompt + done[running[finished]]).sum())
        running = running[~finished]
    return Rollout(seconds=decode_s + prefill_s, decode_s=decode_s, prefill_s=prefill_s,
                   iterations=iterations, peak_running=peak, preemptions=preemptions,
                   mean_output=float(target.mean()), longest=int(target.max()))  # fmt: skip


def _step_pricer(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> Any:
    """Seconds of one decode iteration of ``batch`` sequences at ``context`` mean tokens."""

    @cache
    def priced(batch: int, bucket: int) -> float:
        at = replace(spec, batch=batch, input=max(1, bucket * CONTEXT_BUCKET), output=1)
        return float(decode_step(model, at, hw)["phase"]["total"])

    return lambda batch, context: priced(batch, round(context / CONTEXT_BUCKET))


def _prefill_pricer(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> Any:
    """Seconds to prefill ``prompts`` prompts of ``tokens`` tokens each."""

    @cache
    def priced(prompts: int, tokens: int) -> float:
        at = replace(spec, batch=prompts, input=tokens, output=1)
        return float(serve(model, at, hw)["time_s.prefill.total"])

    return priced
