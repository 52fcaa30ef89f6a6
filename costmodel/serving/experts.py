"""Expert parallelism for serving: a mixture-of-experts model's routed experts split whole
over ``ep`` devices that span the tp ranks of ep / tp replicas, each replica attending its
own requests (attention data parallelism: vLLM's ``--enable-expert-parallel`` with
``--data-parallel-size``, SGLang's DP attention, DeepSeek-V3's deployment, Sec. 3.4).

- **Weights**: a device holds E / ep whole routed experts in place of every expert's 1 / tp
  slice ((E + R) / ep with R redundant copies, EPLB's); attention, dense blocks and shared
  experts stay split over tp.
- **A decode step's experts**: the group's tokens (the batch of each of its ep / tp
  replicas) are routed together, so a device reads those of its E / ep experts that they
  reach: E / ep x (1 − (1 − k/E)^tokens) under uniform routing (with R copies, the (E + R) /
  ep a device holds, each copy taking its share of its expert's tokens). Its FLOPs are the
  tp layout's: tokens x k / ep expert passes against tokens / tp x k slices.
- **Dispatch and combine** (ep > tp): after attention each device sends its 1 / tp share of
  its replica's tokens to the experts' devices and gets their outputs back, in place of the
  MoE layer's tp all-reduce, as DeepEP's normal kernels do (Zhao et al. 2025; SGLang's and
  DeepSeek-V3's deployments, Sec. 3.4): one copy per other node and rank a token's experts
  hit (``costmodel.kinds.dispatch.sends``, spread by the model's routing with its expert
  groups, ``costmodel.kinds.routing``), over the network and NVLink concurrently (the
  longer counts) at DeepEP's measured rates on the device (:func:`dispatcher`: an
  all-to-all of the routed pairs off NVIDIA GPUs),
  after one latency each; the dispatch in the expert GEMMs' narrower input dtype, the
  combine in 16 bits. A decode step runs DeepEP's low-latency kernels instead (SGLang's
  ``--deepep-mode auto``, vLLM's ``deepep_low_latency``: RDMA to every peer, no
  forwarding), at the rates DeepEP measured for them by EP size (:data:`LOW_LATENCY`),
  each token's k copies sent. With ep = tp the experts split over the replica's own ranks
  and the all-reduce stays as it is.
- **Two-batch overlap** (``ServeSpec.batch_overlap``: SGLang's two-batch overlap, vLLM's
  dual-batch overlap): a step runs as two micro-batches whose dispatch and combine each run
  beside the other's kernels (the LMSYS large-scale EP post of 2025-05-05; DeepSeek's
  profile-data), so the device waits only for what of the all-to-alls outlasts the other
  micro-batch's kernels, plus the share of the overlapped part that contention serialises
  (``Hardware.overlap``, training's rule, ``costmodel.parallel.timing.contention``); each
  micro-batch reads the weights its tokens reach, which is why it loses at small batches.
"""

from __future__ import annotations

import math

from costmodel.kinds import ffn
from costmodel.kinds.dispatch import dispatch_rates, sends
from costmodel.kinds.routing import routing_hits
from costmodel.serving import terms
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import DTYPE_BYTES, ServeSpec
from costmodel.symbols.algebra import by_symbol
from costmodel.symbols.core import E_r, k_r


def expert_elements(model: ModelSpec, spec: ServeSpec, vals: dict) -> float:
    """Routed-expert elements on a device: every expert's 1 / tp slice, or (E + R) / ep
    whole experts, R the redundant copies (the same total over ep devices without them)."""
    sliced = float(terms.expert_weights(model).xreplace(by_symbol(vals)))
    if spec.ep == 1:
        return sliced
    copies = (model.n_experts + spec.redundant_experts) / model.n_experts
    return sliced * spec.tp / spec.ep * copies


def group_tokens(spec: ServeSpec, tokens: int) -> int:
    """Tokens routed together in a step: one replica's ``tokens``, times the ep / tp
    replicas an expert group spans."""
    return tokens * max(spec.ep // spec.tp, 1)


def touched(model: ModelSpec, spec: ServeSpec, tokens: int, vals: dict) -> float:
    """Share of a device's routed experts that a step of one replica's ``tokens`` reaches
    (module docstring); 1 for a dense model."""
    if not ffn.routes(model):
        return 1.0
    share = terms.touched_experts(model, group_tokens(spec, tokens))
    slots = vals[E_r] + spec.redundant_experts  # a token reaches one copy of its expert
    return float(share.xreplace(by_symbol({E_r: slots, k_r: vals[k_r]})))


def moe_layers(model: ModelSpec) -> int:
    """Blocks that route (all, or all but the dense leading ones)."""
    return model.n_layers - model.dense_layers if ffn.routes(model) else 0


LOW_LATENCY = {8: (98e9, 127e9), 16: (63e9, 74e9), 32: (48e9, 53e9), 64: (43e9, 46e9),
               128: (39e9, 39e9), 256: (39e9, 40e9)}  # fmt: skip
"""DeepEP's low-latency kernels by EP size: (dispatch, combine) bytes/s of the k copies of
each token a rank sends, measured on H800s with one CX7 400 Gb/s NIC each at 128 tokens
per rank, hidden 7,168, top-8, fp8 dispatch and bf16 combine (deepseek-ai/DeepEP
README.md @0aaa674, "Low-latency kernels with pure RDMA": e.g. EP 8 dispatch 77 us at 98
GB/s, combine 114 us at 127 GB/s; EP 256 194 us at 39 GB/s, 360 us at 40 GB/s)."""
LOW_LATENCY_NIC = 50e9
"""The NIC those rates were measured with (CX7, 400 Gb/s): another device's rates scale
with its ``network_bw`` (the kernels are RDMA-bound)."""


def alltoall_s(model: ModelSpec, spec: ServeSpec, hw: Hardware, tokens: int, nbytes: int,
               decode: bool = False) -> float:  # fmt: skip
    """Seconds of a step's dispatches and combines over the MoE layers for one replica's
    ``tokens``, 0 unless ep > tp (module docstring): the combine in the activations'
    ``nbytes``, the dispatch in the expert GEMMs' input dtype where it is narrower (fp8 or
    fp4 weights: the tokens are quantized before they are sent, as DeepSeek-V3's deployment
    and DeepEP do, Sec. 3.3); a ``decode`` step with DeepEP's low-latency kernels."""
    if spec.ep <= spec.tp:
        return 0.0
    sent = min(nbytes, DTYPE_BYTES[spec.precision])
    if decode and dispatcher(hw) == "deepep":
        copies = tokens / spec.tp * model.experts_per_token * model.d_model
        dispatch, combine = low_latency_rates(spec.ep, hw)
        return moe_layers(model) * copies * (sent / dispatch + nbytes / combine)
    return moe_layers(model) * (_one_way(model, spec, hw, tokens, sent)
                                + _one_way(model, spec, hw, tokens, nbytes))  # fmt: skip


def low_latency_rates(ep: int, hw: Hardware) -> tuple[float, float]:
    """(dispatch, combine) bytes/s of DeepEP's low-latency kernels at ``ep`` ranks: the
    measured :data:`LOW_LATENCY`, linear in log2(ep) between its sizes (its ends beyond
    them), times the device's NIC rate over the CX7's they were measured with."""
    sizes = sorted(LOW_LATENCY)
    x = min(max(math.log2(ep), math.log2(sizes[0])), math.log2(sizes[-1]))
    hi = next(n for n in sizes if math.log2(n) >= x)
    lo = sizes[max(0, sizes.index(hi) - 1)]
    w = 0.0 if hi == lo else (x - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    (d_lo, c_lo), (d_hi, c_hi) = LOW_LATENCY[lo], LOW_LATENCY[hi]
    scale = hw.network_bw / LOW_LATENCY_NIC
    return scale * ((1 - w) * d_lo + w * d_hi), scale * ((1 - w) * c_lo + w * c_hi)


def _one_way(model: ModelSpec, spec: ServeSpec, hw: Hardware, tokens: int, nbytes: float) -> float:
    """One dispatch or combine: DeepEP's copies over NVLink and the network concurrently,
    after one latency."""
    per_token = tokens / spec.tp * model.d_model * nbytes
    node = min(spec.ep, hw.devices_per_node)
    hits = routing_hits("random", model.n_experts, model.experts_per_token, spec.ep, node,
                        model.expert_groups, model.groups_per_token)  # fmt: skip
    link, network, dedup = dispatch_rates(dispatcher(hw), hw)
    remote, local = sends(dedup, model.experts_per_token, spec.ep, node, *hits)
    alpha = hw.network_latency_s if spec.ep > node else hw.link_latency_s
    return alpha + max(per_token * local / link, per_token * remote / network)


def dispatcher(hw: Hardware) -> str:
    """How a serving deployment's tokens reach their experts: DeepEP on NVIDIA GPUs
    (SGLang's ``--moe-a2a-backend deepep``, vLLM's ``deepep_high_throughput``, DeepSeek-V3's
    deployment), an all-to-all of the routed pairs elsewhere (training's rule:
    ``costmodel.kinds.dispatch``)."""
    return "deepep" if hw.kind == "gpu" else "all-to-all"


def allreduces_replaced(model: ModelSpec, spec: ServeSpec) -> int:
    """tp all-reduces a step no longer runs: the MoE layers' second one, when ep > tp."""
    return moe_layers(model) if spec.ep > spec.tp else 0


def weight_reads(spec: ServeSpec) -> int:
    """Micro-batches a step runs, each reading the weights: 2 under two-batch overlap."""
    return 2 if spec.batch_overlap else 1


def exposed_alltoall_s(alltoall: float, beside: float, spec: ServeSpec, hw: Hardware) -> float:
    """Seconds of a step's dispatches and combines (``alltoall``) the device waits for: all
    of them, or under two-batch overlap what outlasts the other micro-batch's kernels
    (``beside``: the step's kernels, half of them each micro-batch's) plus the share of the
    overlapped part the device's ``overlap`` loses to contention (module docstring)."""
    if not spec.batch_overlap:
        return alltoall
    return max(0.0, alltoall - beside) + (1 - hw.overlap) * min(alltoall, beside)


def overlap_note(spec: ServeSpec) -> str:
    """How the assumptions line states the expert all-to-alls."""
    if spec.batch_overlap:
        return (
            "expert dispatch and combine overlapped by two micro-batches (each reads the "
            f"weights; {spec.engine_kind.batch_overlap_flag})"
        )
    return "expert dispatch and combine exposed (not overlapped)"
