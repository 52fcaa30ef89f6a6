"""Pipeline parallelism for serving: a replica's layers split over ``pp`` stages of ``tp``
devices each (vLLM's ``--pipeline-parallel-size``, TensorRT-LLM's ``pp_size``), the batch
split into ``pp`` micro-batches that keep every stage busy (vLLM's virtual engines).

- **A stage** is priced as a model of its own: ceil(L / pp) blocks of the model's last kind
  (an MoE model's last stage routes in every block) and the head, held and read whole (as a
  tied table is); the first stage's embedding table is as large as the last stage's head,
  so the last stage is the largest and, running the head, the slowest.
- **Memory** per device: that stage's weights and the cache of the replica's whole
  ``batch`` for its blocks.
- **Decode**: each micro-batch of ceil(B / pp) sequences passes all stages, each step a
  stage's decode step and one send of its activations to the next stage (NVLink within a
  node, the network beyond); a sequence's next token comes pp such steps later (TPOT),
  while the other micro-batches fill the stages.
- **Prefill** of the batch's prompts: pp micro-batches through pp stages, 2·pp − 1 stage
  steps (the pipeline fills and drains; Huang et al. 2019, GPipe).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from costmodel.kinds import ffn
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import ServeSpec


def stage_model(model: ModelSpec, pp: int) -> ModelSpec:
    """The largest (last) stage as a model: ceil(L / pp) blocks of the last kind."""
    layers = math.ceil(model.n_layers / pp)
    dense = 0 if ffn.routes(model) and layers < model.n_layers else model.dense_layers
    return model.replace(name=f"{model.name} stage", n_layers=layers, dense_layers=dense,
                         tied=True)  # fmt: skip


def send_s(model: ModelSpec, spec: ServeSpec, hw: Hardware, tokens: int, nbytes: int) -> float:
    """One stage's send of ``tokens`` activations to the next stage (a tp rank sends its
    1 / tp share): NVLink when the replica fits a node, else the network."""
    size = tokens * model.d_model * nbytes / spec.tp
    if spec.tp * spec.pp <= hw.devices_per_node:
        return hw.link_latency_s + size / (hw.link_bw * hw.eff("link"))
    return hw.network_latency_s + size / (hw.network_bw * hw.eff("network"))


def pipelined(
    model: ModelSpec, spec: ServeSpec, hw: Hardware, estimate: Callable[..., Any], nbytes: int
) -> dict[str, Any]:
    """The replica's numbers (module docstring) from ``estimate`` (``serve``) of the last
    stage: its memory for the whole batch, its steps for a micro-batch."""
    stage = stage_model(model, spec.pp)
    flat = replace(spec, pp=1)
    whole = estimate(stage, flat, hw).values  # memory: the batch's cache on the stage
    micro = math.ceil(spec.batch / spec.pp)
    step = estimate(stage, replace(flat, batch=micro), hw).values
    decode_send = send_s(model, spec, hw, micro, nbytes)
    tpot = spec.pp * (step["time_s.tpot"] + decode_send)
    prompts = send_s(model, spec, hw, micro * spec.input, nbytes)
    ttft = (2 * spec.pp - 1) * (step["time_s.ttft"] + prompts)
    e2e = ttft + (spec.output - 1) * tpot
    keep = ("memory_bytes", "kv_", "max_batch", "fits")
    out = {k: v for k, v in whole.items() if k.startswith(keep)}
    out.update({k: v for k, v in step.items() if k.startswith(("time_s.decode_step",
                                                               "time_s.prefill"))})  # fmt: skip
    out.update({k: v for k, v in step.items() if k.startswith(("flops_", "bytes_"))})
    tokens = spec.dp * spec.batch * spec.output / e2e
    out.update({
        "time_s.pipeline.stage_decode_step": step["time_s.tpot"],
        "time_s.pipeline.send": decode_send,
        "pipeline.layers_per_stage": stage.n_layers,
        "time_s.ttft": ttft, "time_s.tpot": tpot, "time_s.e2e": e2e,
        "throughput.output_tokens_per_s": tokens,
        "throughput.total_tokens_per_s": tokens * (spec.input + spec.output) / spec.output,
        "throughput.output_tokens_per_s_per_gpu": tokens / (spec.dp * spec.tp * spec.pp),
    })  # fmt: skip
    return out
