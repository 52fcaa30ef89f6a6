"""Host time of one micro-batch on one device: the kernels a phase dispatches, and the host
work a device waits for (seconds).

Each kernel costs the host ``Hardware.dispatch_s`` (``costmodel.single.kernels`` counts
them): a CPU runs it on the dispatching thread, so the two add; an asynchronous accelerator
queues it, so a phase takes the longer of the device's and the host's time (He 2022,
"Making Deep Learning Go Brrrr", the overhead-bound regime).

A dropless MoE layer breaks that overlap where its expert GEMMs need their split sizes on
the host: Megatron-Core's grouped MLP (Transformer Engine's ``GroupedLinear``) takes the
tokens per local expert as a host list, copied from the device after routing (a
device-to-host sync in every MoE layer's forward; NVIDIA, "Scalable Training of
Mixture-of-Experts Models with Megatron Core", 2026, Sec. 4.3.1: dropless routing's host
sync, and its host overhead growing with fine-grained experts). The device then idles
while the host walks its loop over the local experts, one GEMM launch each, and so adds
``Hardware.expert_call_s`` per launch to the device's time: forward fc1 (gate and up
fused) and fc2, backward the data and weight gradients of both, and the forward again
where blocks are recomputed in full.
"""

from __future__ import annotations

import sympy as sp

from costmodel.frameworks.registry import framework_of
from costmodel.parallel.shares import device_blocks, residual_bytes, routed_blocks
from costmodel.single.kernels import layer_kernels, model_kernels
from costmodel.single.memory import checkpointed_share
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols import E_r, N_ep, s_sync, smax, smin, t_ex, t_op

EXPERT_LINEARS = 2
"""Grouped linears per expert in Megatron-Core's grouped MLP: fc1 (the gated activation's
two projections fused) and fc2."""


def host_seconds(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> tuple:
    """(forward, backward) host seconds of one micro-batch on this stage: the kernels it
    dispatches (``costmodel.single.kernels``: its layers, and the embedding, head and loss,
    an upper bound for a middle stage) times the host's seconds per kernel."""
    residual = residual_bytes(train, par)
    host = list(model_kernels(model, train, residual))
    for kind, blocks in device_blocks(model, par):  # each FFN kind's blocks, its kernels
        layer = layer_kernels(model, train, residual, block=kind.name)
        host = [h + blocks * n for h, n in zip(host, layer, strict=True)]
    return tuple(h * t_op for h in host)


def with_host(device: sp.Expr, host: sp.Expr) -> sp.Expr:
    """A phase's seconds from its device and host seconds: where kernels run on the
    dispatching thread (CPU, ``s_sync`` 1) they add; an asynchronous device overlaps them
    and takes the longer (max + s_sync·min)."""
    return smax(device, host) + s_sync * smin(device, host)


def exposed_expert_host(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec
) -> tuple[sp.Expr, sp.Expr]:
    """(forward, backward) host seconds of one micro-batch on this stage that the device
    waits for: each MoE block's launches of its E/ep local experts' GEMMs, under a framework
    whose grouped linears loop over the experts on the host (``expert_gemm_loop``), at
    ``t_ex`` seconds each. Forward: fc1 and fc2 per expert; backward their data and weight
    gradients, plus the forward's again under full recomputation. 0 otherwise."""
    if not framework_of(par).expert_gemm_loop:
        return sp.Integer(0), sp.Integer(0)
    launches = routed_blocks(model, par) * E_r / N_ep * EXPERT_LINEARS
    forward = launches * t_ex
    again = checkpointed_share(train) * forward if train.recompute == "full" else 0
    backward = 2 * forward + again
    return forward, backward
