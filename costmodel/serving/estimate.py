"""A serving estimate: memory per device, prefill and decode time, TTFT, TPOT, throughput.

Time is a roofline per kernel on one device (Williams et al. 2009): the dense matmuls, a
MoE model's routed experts (one grouped kernel, at ``efficiency.serve_grouped`` of the
matmuls' rate), then the attention core, each the longer of its FLOPs (matmuls at
``efficiency.serve_matmul`` of the peak, else the training ``matmul``; a prompt's core at
the fused-attention rate, ``Hardware.attention_peak``) and its bytes (the weights; the
cache) at ``Hardware.hbm_bandwidth`` (decode's at ``efficiency.decode`` of it); an eager engine's
elementwise bytes added (``costmodel.serving.eager``), tp's two all-reduces per layer
(after attention and after the FFN; Shoeybi et al. 2019, Sec. 3) of the phase's tokens x D
activations (:func:`_allreduce_s`), exposed, and ``Hardware.serve_layer_s`` per layer;
against an eager engine's host dispatch (added on a CPU, the longer of the two on a GPU);
then the serving engine's own host time per iteration (``costmodel.specs.engines``: what
the device waits for added, the rest overlapped). ``efficiency.decode``,
``efficiency.serve_matmul``, ``efficiency.serve_grouped`` and ``serve_layer_s`` are fitted
on published serving runs (``hardware.json``'s notes).

- **Prefill** (TTFT): the B prompts of ``input`` tokens at once; bytes: the weights read
  once and the cache written. Chunked prefill changes when, not how much.
- **Decode** (TPOT): one token for each of B sequences per step, at the mean cache of the
  steps, ``input + output / 2`` tokens (a step's time is linear in it on either side of
  the roofline); bytes: the weights (routed experts: those the step's tokens reach) and
  every cached key and value read once.
- **End to end**: TTFT + (output − 1) x TPOT; output tokens/s = dp x B x output over it.
- **Memory** per device: weights (fp8 precision keeps embedding, head and norms in bf16, as
  fp8 checkpoints do), the cache in whole ``block_size`` blocks, and a workspace: one
  layer's activations for the prompt tokens of a step (at most the engine's token budget,
  vLLM's ``max_num_batched_tokens``), in 16 bits, over the widths the layer writes (2 x D
  for the norm and residual, the projections' outputs, the FFN's hidden), and the last
  tokens' fp32 logits. ``max_batch`` is the largest B whose memory fits
  ``memory_utilization`` of the device.

Each option a deployment adds is priced by its own module on top of these steps:
speculative decoding (:mod:`costmodel.serving.speculative`), experts whole over devices across
replicas (:mod:`costmodel.serving.experts`), pipeline stages (:mod:`costmodel.serving.pipeline`),
prefill on replicas of its own (:mod:`costmodel.serving.disaggregated`) and continuous batching
in steady state (:mod:`costmodel.serving.continuous`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Any

from costmodel.serving import (
    continuous,
    counts,
    disaggregated,
    eager,
    experts,
    notes,
    pipeline,
    queueing,
    speculative,
    terms,
)
from costmodel.serving.fp8 import block_fp8_triton
from costmodel.serving.result import ServeEstimate
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import DTYPE_BYTES, ServeSpec
from costmodel.specs.serving_device import check, gemm_dtype
from costmodel.symbols.core import B, D, T, Y, values_for


def act_bytes(spec: ServeSpec) -> int:
    """Bytes of an activation: 16 bits (fp8 GEMMs take and give 16-bit activations), fp32's 4."""
    return 4 if spec.precision == "fp32" else 2


def _allreduce_s(elements: float, spec: ServeSpec, hw: Hardware) -> float:
    """One tp all-reduce of ``elements`` 16-bit activations, 0 without tp: the faster of
    a ring (2(Y − 1) rounds of α, 2(Y − 1)/Y of the bytes over the link) and the one-shot
    kernel serving engines use for small tensors (each rank reads its Y − 1 peers' whole
    tensors over NVLink, then reduces: 2 α; vLLM's custom all-reduce, TensorRT-LLM's
    ONESHOT strategy)."""
    y = spec.tp
    if y == 1:
        return 0.0
    size, alpha = elements * act_bytes(spec), hw.link_latency_s
    beta = hw.link_bw * hw.eff("link")
    ring = 2 * (y - 1) * alpha + 2 * (y - 1) / y * size / beta
    return min(ring, 2 * alpha + (y - 1) * size / beta)


def _memory(model: ModelSpec, spec: ServeSpec, hw: Hardware, vals: dict) -> dict[str, Any]:
    wb = DTYPE_BYTES[spec.precision]
    kvb = DTYPE_BYTES[spec.kv_dtype]
    act = act_bytes(spec)
    weights = counts.num(terms.block_weights(model) * wb + terms.other_weights(model) * act, vals)
    weights += _expert_shift(model, spec, vals) * wb
    per_token = kvb * counts.num(terms.kv_elements_per_token(model), vals)
    one = {**vals, Y: 1}  # the whole cache of a token, unsplit
    kv_seq = kvb * counts.num(terms.kv_elements(model), {**vals, T: spec.context})
    kv_seq_paged = paged_cache_bytes(model, spec, spec.context)
    width = counts.num(2 * D + terms.layer_widths(model), vals)
    logits = 4 * model.vocab / spec.tp
    chunk = spec.token_budget
    work = act * width * min(spec.batch * spec.input, chunk) + logits * spec.batch
    budget = hw.hbm_bytes * spec.memory_utilization
    draft = {"weights": 0, "per_sequence": 0}
    if spec.draft_tokens:
        draft = speculative.extra_memory(model, spec, wb, paged_cache_bytes)
    drafter = draft["weights"] + spec.batch * draft["per_sequence"]
    total = weights + spec.batch * kv_seq_paged + work + drafter
    room = budget - weights - act * width * chunk - draft["weights"]
    max_batch = max(0, int(room // (kv_seq_paged + logits + draft["per_sequence"])))
    return {
        "memory_bytes_per_device.drafter": drafter,
        "memory_bytes_per_device.weights": weights,
        "memory_bytes_per_device.kv_cache": spec.batch * kv_seq,
        "memory_bytes_per_device.kv_cache_paged": spec.batch * kv_seq_paged,
        "memory_bytes_per_device.workspace": work,
        "memory_bytes_per_device.total": total,
        "memory_bytes_per_device.budget": budget,
        "memory_bytes_per_device.kv_room": room,
        "kv_bytes_per_token": per_token,
        "kv_split_over_tp": per_token < kvb * counts.num(terms.kv_elements_per_token(model), one),
        "kv_bytes_per_sequence": kv_seq,
        "fits": total <= budget and max_batch >= 1,  # an engine that holds no sequence
        "max_batch": max_batch,  # does not start (it profiles a full token budget's work)
    }


def _phase(
    gemms: tuple[float, float], core: tuple[float, float], tokens: float, model: ModelSpec,
    spec: ServeSpec, hw: Hardware, bandwidth: float, sequences: float | None = None,
    decode: bool = False, routed: tuple[float, float] = (0.0, 0.0),
) -> dict[str, float]:  # fmt: skip
    """Seconds of one phase on a device. ``gemms``: the matmuls' (FLOPs, bytes: the weights
    read), of which ``routed`` are the routed experts' (one grouped kernel per layer and
    projection); ``core``: the attention core's (seconds of its FLOPs at its rate, bytes:
    the cache read or written). The three are separate kernels that run one after the
    other, each the longer of its FLOPs and its bytes (Williams et al. 2009's roofline per
    kernel: a large batch's matmuls are compute-bound while its attention over the cache is
    memory-bound, and neither hides the other); the routed experts' FLOPs at the grouped
    kernel's rate (:meth:`Hardware.serve_grouped_flops`: each expert's rows are the few
    tokens routed to it, gathered by index). Then an eager engine's elementwise traffic,
    tp's exposed all-reduces and the per-layer step overhead (``Hardware.serve_layer_s``);
    then the host's: the kernels' dispatch where the engine runs op by op
    (:func:`eager.host_s`) and the engine's own per iteration of ``sequences`` (default the
    batch;
    ``costmodel.specs.engines``). ``decode``: a decode step (its expert all-to-alls on
    DeepEP's low-latency kernels, ``costmodel.serving.experts``)."""
    dtype = gemm_dtype(spec.precision, hw)
    rate = hw.serve_flops(dtype)
    elementwise = eager.elementwise_s(model, spec, hw, tokens)
    dense = (gemms[0] - routed[0], gemms[1] - routed[1])
    matmuls = (dense[0] / rate, dense[1] / bandwidth)  # (compute, memory) seconds
    grouped = hw.serve_grouped_flops(dtype, block_triton=block_fp8_triton(model, spec))
    experts_ = (routed[0] / grouped, routed[1] / bandwidth)
    attention_ = (core[0], core[1] / bandwidth)
    compute = matmuls[0] + experts_[0] + core[0] + elementwise
    memory = (gemms[1] + core[1]) / bandwidth
    kernels = max(matmuls) + max(experts_) + max(attention_)
    reduces = 2 * model.n_layers - experts.allreduces_replaced(model, spec)
    comm = reduces * _allreduce_s(tokens * model.d_model, spec, hw)
    alltoall = experts.alltoall_s(model, spec, hw, tokens, act_bytes(spec), decode)
    comm += experts.exposed_alltoall_s(alltoall, kernels + elementwise, spec, hw)
    overhead = model.n_layers * hw.serve_layer_s
    device = kernels + elementwise + comm + overhead
    dispatch = eager.host_s(model, spec, hw)
    kind = spec.engine_kind
    sequences = spec.batch if sequences is None else sequences
    host = dispatch + kind.host_s(sequences)
    # a CPU runs each kernel on the dispatching thread (all of it adds); a GPU's kernels run
    # while the host dispatches the next (the longer of the two), then the engine's own
    total = device + host if hw.kind == "cpu" else kind.iteration_s(max(device, dispatch),
                                                                     sequences)  # fmt: skip
    return {"compute": compute, "memory": memory, "comm": comm, "overhead": overhead,
            "host": host, "total": total, "matmuls_compute": matmuls[0],
            "matmuls_memory": matmuls[1], "experts_compute": experts_[0],
            "experts_memory": experts_[1], "attention_compute": attention_[0],
            "attention_memory": attention_[1]}  # fmt: skip


def paged_cache_bytes(model: ModelSpec, spec: ServeSpec, tokens: int) -> int:
    """One sequence's cache of ``tokens`` on a device, in whole ``block_size`` blocks."""
    slots = math.ceil(tokens / spec.block_size) * spec.block_size
    at = {**values_for(model), Y: spec.tp, T: slots}
    return DTYPE_BYTES[spec.kv_dtype] * counts.num(terms.kv_elements(model), at)


def prompt_attention_rate(spec: ServeSpec, hw: Hardware) -> float:
    """FLOP/s of the fused attention kernel over a prompt of ``input`` keys, in the
    activations' dtype (16 bits beside fp8 and fp4 GEMMs): the kernel family the engine's
    prefill runs on this device (:func:`notes.prompt_kernel`: FlashAttention-3's rate on a
    Hopper GPU under vLLM V1, SGLang and TensorRT-LLM, the device's default elsewhere)."""
    dtype, kernel = notes.prompt_kernel(spec, hw)
    return float(hw.attention_peak(dtype, kernel=kernel, seq=spec.input))


def _read_weights(model: ModelSpec, spec: ServeSpec, vals: dict) -> tuple[float, float]:
    """(bytes of the weights a step reads, bytes of the routed experts among them): all but
    an untied embedding table (its rows are looked up)."""
    wb = DTYPE_BYTES[spec.precision]
    weights = counts.num(terms.block_weights(model) * wb
                   + (terms.other_weights(model) - terms.unread_embedding(model))
                   * act_bytes(spec), vals)  # fmt: skip
    weights += _expert_shift(model, spec, vals) * wb
    return weights, experts.expert_elements(model, spec, vals) * wb


def _expert_shift(model: ModelSpec, spec: ServeSpec, vals: dict) -> float:
    """Routed-expert elements a device holds under ep beyond its tp slices (negative: fewer
    whole experts than every expert's slice; 0 without ep)."""
    if spec.ep == 1:
        return 0
    held = counts.num(terms.expert_weights(model), vals)
    return experts.expert_elements(model, spec, vals) - held


def _reached(
    model: ModelSpec, spec: ServeSpec, vals: dict, at: dict, tokens: float,
    weights: float, routed: float,
) -> tuple[float, tuple[float, float]]:  # fmt: skip
    """What ``tokens`` through the blocks read of ``weights`` bytes, of which ``routed`` are
    the routed experts' (only the experts they reach; each micro-batch its own), and the
    routed experts' (FLOPs, bytes read): the grouped kernel's part of the matmuls."""
    reads = experts.weight_reads(spec)
    touched = experts.touched(model, spec, tokens / reads, vals)
    read = reads * (weights - routed * (1 - touched))
    return read, (counts.expert_flops(model, tokens, at), reads * routed * touched)


def decode_step(
    model: ModelSpec, spec: ServeSpec, hw: Hardware, per_seq: int = 1, extra: int = 0
) -> dict[str, Any]:
    """One decode step of B sequences with ``per_seq`` new tokens each (a verify step of
    speculative decoding scores several) at the steps' mean cache: the phase's seconds,
    its FLOPs and bytes. ``extra``: elements of one more matrix every token multiplies by
    (a drafter's)."""
    b, i, o = spec.batch, spec.input, spec.output
    vals = {**values_for(model), Y: spec.tp}
    weights, routed = _read_weights(model, spec, vals)
    weights += extra * DTYPE_BYTES[spec.precision]
    keys = Fraction(2 * i + o, 2)
    at = {**vals, B: b, T: keys}
    tokens = b * per_seq
    linear = counts.linear_flops(model, tokens, tokens, at) + 2 * tokens * extra
    core = per_seq * counts.num(terms.decode_core_flops(model), at)
    kv_read = b * DTYPE_BYTES[spec.kv_dtype] * counts.num(terms.kv_elements(model), at)
    read, expert = _reached(model, spec, vals, at, tokens, weights, routed)
    rate = hw.serve_flops(gemm_dtype(spec.precision, hw))
    phase = _phase((linear, read), (core / rate, kv_read), tokens, model, spec, hw,
                   hw.decode_bandwidth(), decode=True, routed=expert)  # fmt: skip
    return {"phase": phase, "flops": linear + core, "linear_flops": linear, "core_s": core / rate,
            "bytes": read + kv_read, "weight_bytes": read, "kv_bytes": kv_read,
            "expert_flops": expert[0], "expert_bytes": expert[1]}  # fmt: skip


def _times(model: ModelSpec, spec: ServeSpec, hw: Hardware, vals: dict) -> dict:
    """Prefill, decode, end to end and throughput (module docstring)."""
    b, i, o = spec.batch, spec.input, spec.output
    kvb = DTYPE_BYTES[spec.kv_dtype]
    weights, routed = _read_weights(model, spec, vals)
    at = {**vals, B: b}
    # prefill: B prompts of I tokens; the core at the fused kernel's rate for I keys
    pre_flops = counts.linear_flops(model, b * i, b, at)
    core = counts.num(terms.prefill_core_flops(model), {**at, T: i})
    rate = prompt_attention_rate(spec, hw)
    written = b * kvb * counts.num(terms.kv_elements(model), {**at, T: i})
    read, expert = _reached(model, spec, vals, at, b * i, weights, routed)
    pre = _phase((pre_flops, read), (core / rate, written), b * i, model, spec, hw,
                 hw.hbm_bandwidth(), routed=expert)  # fmt: skip
    dec = decode_step(model, spec, hw)
    out = {f"time_s.prefill.{k}": v for k, v in pre.items()}
    out.update({f"time_s.decode_step.{k}": v for k, v in dec["phase"].items()})
    tpot = dec["phase"]["total"]
    if spec.draft_tokens:
        out.update(speculative.cycle(model, spec, hw, decode_step))
        tpot = out["time_s.speculative.per_token"]
    e2e = pre["total"] + (o - 1) * tpot
    out.update({
        "time_s.ttft": pre["total"], "time_s.tpot": tpot, "time_s.e2e": e2e,
        "flops_per_device.prefill": pre_flops + core, "flops_per_device.decode_step": dec["flops"],
        "bytes_per_device.decode_step": dec["bytes"],
        "bytes_per_device.decode_step_kv": dec["kv_bytes"],
        "bytes_per_device.decode_step_experts": dec["expert_bytes"],
        "throughput.output_tokens_per_s": spec.dp * b * o / e2e,
        "throughput.total_tokens_per_s": spec.dp * b * (i + o) / e2e,
        "throughput.output_tokens_per_s_per_gpu": b * o / e2e / spec.tp,
    })  # fmt: skip
    return out


def serve(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> ServeEstimate:
    """The estimate (module docstring) of ``spec`` served with ``model`` on ``hw``."""
    if model.ffn_only:
        raise SpecError("model", f"{model.name} has no attention and no cache to serve")
    check(model, spec, hw)
    if spec.token_budget is None:  # whole prompts: the model's context length
        positions = int(model.max_positions * spec.rope_scaling)
        spec = replace(spec, token_budget=spec.engine_kind.budget(positions))
    for name, degree in (("tp", spec.tp), ("prefill_tp", spec.prefill_degree)):
        if degree > hw.devices_per_node:
            raise SpecError(name, f"{name} ({degree}) must be <= {hw.name}'s "
                            f"{hw.devices_per_node} devices per node (serve more with "
                            "replicas)")  # fmt: skip
    if spec.pp > 1:
        out = pipeline.pipelined(model, spec, hw, serve, act_bytes(spec))
        layers, micro = out["pipeline.layers_per_stage"], math.ceil(spec.batch / spec.pp)
        return ServeEstimate(out, [f"pp {spec.pp}: the last stage's {layers} blocks and head "
                                   f"priced; micro-batches of {micro} sequences"])  # fmt: skip
    asked = spec.batch
    vals = {**values_for(model), Y: spec.tp}
    if spec.arrival != "together":  # in flight: what the token budget keeps, the cache holds
        cached = max(1, _memory(model, replace(spec, batch=1), hw, vals)["max_batch"])
        kept = spec.batch if spec.simulated else continuous.kept_batch(spec)
        if spec.concurrency:  # a closed loop never holds more than its users
            kept = min(kept, -(-spec.concurrency // spec.dp))
        spec = replace(spec, batch=min(kept, cached))
    rated = _at_rate(model, spec, hw) if spec.request_rate and not spec.simulated else {}
    if rated:
        spec = replace(spec, batch=rated["continuous.in_flight"])
    out = _memory(model, spec, hw, vals)
    if spec.concurrency:  # a closed loop's users a replica cannot hold at once wait
        out["workload.users_waiting"] = max(0, queueing.users_of(spec) - spec.batch)
        out["workload.slots"] = spec.batch  # what a replica holds at once: cap, memory
    out.update(_times(model, spec, hw, vals))
    if spec.prefill_replicas:
        out.update(disaggregated.pools(model, spec, hw, out, serve, spec.token_budget))
    rate = prompt_attention_rate(spec, hw)
    if spec.simulated:  # request by request: its means are the answer's times
        most = spec.batch if spec.request_rate is None else None
        capacity = math.inf if most is not None else _capacity(model, spec, hw)
        sim = queueing.simulate(model, spec, hw, decode_step, _phase, rate, spec.requests,
                                capacity=capacity)  # fmt: skip
        # its step as the load holds it: the mean in flight a replica (Little's law)
        held = sim["workload.sustained_per_s"] / spec.dp * sim["time_s.e2e"]
        held = max(1, min(spec.batch, round(held)))
        out.update(_memory(model, replace(spec, batch=held), hw, vals))  # as the others:
        out.update(_times(model, replace(spec, batch=held), hw, vals))  # the load's cache
        out.update(sim, **{"workload.in_flight": held})
    elif spec.arrival == "continuous":
        out.update(continuous.iteration(model, spec, hw, decode_step, _phase, rate))
    out.update(rated)
    return ServeEstimate(out, notes.for_estimate(model, spec, asked, out, hw))


def _capacity(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> float:
    """Requests/s the deployment sustains in steady state: ``dp`` replicas of the most
    sequences in flight (the batch cap, and what fits) over their end to end, as
    ``continuous.in_flight`` prices it."""
    most, e2e = _load(model, spec, hw)
    return spec.dp * most / e2e(most)


def _load(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> tuple[int, Any]:
    """(the most sequences a replica holds: the batch cap and what fits, a sequence's end
    to end at a batch held in flight) of a continuously batching engine."""
    vals = {**values_for(model), Y: spec.tp}
    fits = max(1, _memory(model, replace(spec, batch=1), hw, vals)["max_batch"])
    rate = prompt_attention_rate(spec, hw)

    def e2e(batch: int) -> float:
        at = replace(spec, batch=batch)
        return continuous.iteration(model, at, hw, decode_step, _phase, rate)["time_s.e2e"]

    return min(spec.batch, fits), e2e


def _at_rate(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> dict[str, Any]:
    """At ``spec.request_rate``: the sequences a replica holds in flight
    (``continuous.in_flight``, at most the batch the token budget keeps and what fits), the
    requests/s the deployment sustains, and the throughput it serves (λ x tokens)."""
    most, e2e = _load(model, spec, hw)
    held, capacity = continuous.in_flight(spec, e2e, most)
    served = spec.request_rate * spec.output
    return {"continuous.in_flight": held, "continuous.capacity_requests_per_s": capacity,
            "throughput.output_tokens_per_s": served,
            "throughput.total_tokens_per_s": served * spec.context / spec.output,
            "throughput.output_tokens_per_s_per_gpu": served / (spec.dp * spec.tp)}  # fmt: skip
