"""Disaggregated serving: prompts prefilled on replicas of their own, the cache handed to
decode replicas that only decode (DistServe, Zhong et al. 2024; Splitwise, Patel et al.
2024; DeepSeek-V3's deployment, Sec. 3.4; NVIDIA Dynamo).

- **Prefill pool**: ``prefill_replicas`` replicas of ``prefill_tp`` devices run prompts in
  steps of up to the engine's token budget C, n = max(1, C // input) prompts a
  step, each step the colocated estimate's prefill of n prompts on that replica.
  Capacity: replicas x n prompts per step time.
- **Hand-off**: a prompt's cache (its input tokens, every layer, one copy) crosses the
  scale-out network from the prefill replica's devices to the decode replica's, each of
  the ``prefill_tp`` devices sending its share at the network's rate (``network_bw`` x
  ``efficiency.network``), after one network latency (RDMA, as NIXL moves it).
- **Decode pool**: the ``dp`` replicas of ``tp`` devices decode ``batch`` sequences each and
  are never stalled by a prompt: TPOT is the decode step (or the speculative cycle per
  token). Capacity: dp x batch requests per (output − 1) TPOTs (the first token came from
  prefill).
- **The deployment** serves the smaller capacity (requests/s) x output tokens. A static
  batch (``arrival`` together: every replica's ``batch`` at once) waits for the prefill
  pool's waves: wave i (replicas x n prompts) has its first token after i + 1 prefill
  steps, so TTFT is the mean over the batch of its wave's steps, plus the hand-off (the
  other arrivals are not yet modelled with disaggregated prefill). End to end: TTFT +
  (output − 1) x TPOT.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from costmodel.serving import terms
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import DTYPE_BYTES, ServeSpec
from costmodel.symbols.algebra import by_symbol
from costmodel.symbols.core import T, Y, values_for


def prefill_spec(spec: ServeSpec, chunk: int) -> ServeSpec:
    """One prefill replica's step: as many whole prompts as fit ``chunk`` tokens (at least
    one), each generating its first token only."""
    prompts = max(1, chunk // spec.input)
    return replace(spec, batch=prompts, output=1, tp=spec.prefill_degree, dp=1,
                   prefill_replicas=0, prefill_tp=None, draft_tokens=0,
                   acceptance=None)  # fmt: skip


def handoff_s(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> float:
    """Seconds to move one prompt's cache (one copy of its input tokens' keys and values,
    every layer) from a prefill replica to a decode replica over the network."""
    elements = terms.kv_elements(model).xreplace(
        by_symbol({**values_for(model), Y: 1, T: spec.input})
    )
    nbytes = DTYPE_BYTES[spec.kv_dtype] * int(elements)
    rate = spec.prefill_degree * hw.network_bw * hw.eff("network")
    return hw.network_latency_s + nbytes / rate


def prefill_waves(spec: ServeSpec, per_step: int) -> float:
    """Prefill steps a request of a static batch waits for its first token, on average
    over the batch: its ``dp`` x ``batch`` prompts in waves of ``prefill_replicas`` x
    ``per_step``, wave i done after i + 1 steps."""
    if spec.arrival != "together":
        return 1.0
    total, wave = spec.dp * spec.batch, spec.prefill_replicas * per_step
    full, rest = divmod(total, wave)
    steps = wave * full * (full + 1) / 2 + rest * (full + 1)  # sum over prompts of i + 1
    return steps / total


def pools(
    model: ModelSpec, spec: ServeSpec, hw: Hardware, decoded: dict[str, Any],
    estimate: Callable[..., Any], chunk: int,
) -> dict[str, Any]:  # fmt: skip
    """The deployment's numbers (module docstring) from the decode replicas' estimate
    (``decoded``: ``serve``'s values for ``spec``) and ``estimate`` (``serve``) of one
    prefill step."""
    step_spec = prefill_spec(spec, chunk)
    step = estimate(model, step_spec, hw).values
    prefill_rate = spec.prefill_replicas * step_spec.batch / step["time_s.ttft"]
    tpot, out = decoded["time_s.tpot"], spec.output
    decode_rate = spec.dp * spec.batch / max(out - 1, 1) / tpot
    requests = min(prefill_rate, decode_rate)
    handoff = handoff_s(model, spec, hw)
    waves = prefill_waves(spec, step_spec.batch)
    ttft = step["time_s.ttft"] * waves + handoff
    tokens = requests * out
    return {
        "disaggregated.prefill_step_s": step["time_s.ttft"],
        "disaggregated.prefill_waves_mean": waves,
        "disaggregated.prefill_prompts_per_step": step_spec.batch,
        "disaggregated.prefill_fits": step["fits"],
        "fits": decoded["fits"] and step["fits"],
        "disaggregated.prefill_memory_bytes_per_device": step["memory_bytes_per_device.total"],
        "disaggregated.handoff_s": handoff,
        "disaggregated.prefill_requests_per_s": prefill_rate,
        "disaggregated.decode_requests_per_s": decode_rate,
        "disaggregated.prefill_replicas_to_balance": spec.prefill_replicas
        * decode_rate
        / prefill_rate,
        "time_s.ttft": ttft,
        "time_s.e2e": ttft + (out - 1) * tpot,
        "throughput.output_tokens_per_s": tokens,
        "throughput.total_tokens_per_s": requests * (spec.input + out),
        "throughput.output_tokens_per_s_per_gpu": tokens / spec.gpus,
    }
