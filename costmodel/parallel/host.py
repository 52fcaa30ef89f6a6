"""Host time of one micro-batch on one device: the kernels a phase dispatches, the expert
GEMMs a per-expert loop launches, and the device's idle time at an MoE layer's host sync
(seconds).

Each kernel costs the host ``Hardware.dispatch_s`` (``costmodel.single.kernels`` counts
them): a CPU runs it on the dispatching thread, so the two add; an asynchronous accelerator
queues it, so a phase takes the longer of the device's and the host's time (He 2022,
"Making Deep Learning Go Brrrr", the overhead-bound regime).

A dropless MoE layer's forward ends the host's run-ahead: the token counts routing leaves
on the device are copied to the host, which waits for them before the dispatch (Megatron-
Core's alltoall dispatcher: ``d2h_event.synchronize()`` in ``_maybe_dtoh_and_synchronize``,
one per MoE layer forward, the splits reused by backward; DeepEP's host spin on its
received-token counter; torchtitan's all-to-all ``output_splits.to("cpu")``; Megatron
without ep still reads ``tokens_per_expert`` for its grouped linears). After it the device
cannot start what follows the sync (the permutation, the dispatch, the expert GEMMs, the
combine) before the host launches it: a layer whose post-sync segment takes the host longer
than the device idles the device for the difference, however far ahead the host ran before
(the host cannot run ahead across a sync), at least one launch. A phase then takes the
longer of its host time and its device time plus those idle seconds: with a sync before
segment B of each layer and A (the attention, the router) after it, a layer takes
max(D_B + D_A, H_B + D_A, H_B + H_A) = max(D + (H_B - D_B), H) (a two-stage chain of host
launches feeding the device). A dispatch padded to its capacity (``capacity_pad``) has
static shapes and no sync (Megatron-Core's ``drop_and_pad``: ``cuda_sync_point`` stays
``no_sync``; Megatron-Bridge's ``apply_moe_token_drop`` sets capacity 1.0 with padding; a
capacity without padding still syncs, ``before_permutation_1``): NeMo's 25.09 token-drop
recipes ran Qwen3-30B-A3B 2x faster than the same layouts dropless in 25.11 on H100 and
B200, and AMD's sync-free MoE gained 7.7 % on DeepSeek-V2 (Primus moe_package, Figure 7).
Where the grouped expert linears loop over the local experts on the host
(Transformer Engine's ``GroupedLinear`` over cuBLAS, Megatron-Core's legacy
``grouped_gemm`` on Hopper: one GEMM launch per expert and linear, ``Hardware.expert_call_s``
each), that loop is host time too: forward fc1 (gate and up fused) and fc2, backward the
data and weight gradients of both, and the forward again where blocks are recomputed in
full. One grouped kernel reading its offsets on the device (torch's ``_grouped_mm``) has
no loop. Kernels replayed from a CUDA graph cost the host one launch per graph
(``ParallelSpec.cuda_graphs``: Megatron-Core's partial graphs of attention and the MoE
router; a whole-step graph, which a sync-free dispatch allows, costs no host time and no
sync). Published micro-batch sweeps show the shape: AMD's DeepSeek-V2-Lite on one MI355X
node keeps about 0.38 s per micro-batch at micro-batches 1 and 2, where the host binds,
then grows with the micro-batch, where the device does (AMD-AGI/Primus
examples/moe_package; ``validate/published/data/moe_amd_baai.json``). The host seconds
are fitted (``costmodel/catalog/data/fitted.json``, record ``host``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.kinds.ffn import dense
from costmodel.parallel.shares import device_blocks, residual_bytes, routed_blocks
from costmodel.single.kernels import graphed_kernels, layer_kernels, model_kernels
from costmodel.single.memory import checkpointed_share
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import (
    E_r,
    N_ep,
    c_pad,
    g_full,
    g_part,
    l_ex,
    more_than_one,
    s_sync,
    smax,
    smin,
    t_ex,
    t_op,
)
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

EXPERT_LINEARS = 2
"""Grouped linears per expert in Megatron-Core's grouped MLP: fc1 (the gated activation's
two projections fused) and fc2."""


def host_seconds(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> tuple:
    """(forward, backward) host seconds of one micro-batch on this stage: the kernels it
    dispatches (``costmodel.single.kernels``: its layers, and the embedding, head and loss,
    an upper bound for a middle stage) times the host's seconds per kernel, those CUDA
    graphs replay counted as one launch per graph, and the expert GEMMs a per-expert loop
    launches (:func:`expert_launches`) times its seconds per launch; nothing where the
    whole step replays from one graph."""
    residual = residual_bytes(train, par)
    host = list(model_kernels(model, train, residual))
    for kind, blocks in device_blocks(model, par):  # each FFN kind's blocks, its kernels
        layer = layer_kernels(model, train, residual, block=kind.name)
        captured = graphed_kernels(model, train, block=kind.name)
        host = [
            h + blocks * (n - g_part * c) for h, n, c in zip(host, layer, captured, strict=True)
        ]
    loop = expert_launches(model, train, par)
    return tuple((1 - g_full) * (h * t_op + n * t_ex) for h, n in zip(host, loop, strict=True))


def with_host(device: sp.Expr, host: sp.Expr) -> sp.Expr:
    """A phase's seconds from its device and host seconds: where kernels run on the
    dispatching thread (CPU, ``s_sync`` 1) they add; an asynchronous device overlaps them
    and takes the longer (max + s_sync·min)."""
    return smax(device, host) + s_sync * smin(device, host)


def expert_launches(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> tuple:
    """(forward, backward) expert GEMM launches of one micro-batch on this stage where the
    grouped linears loop over the E/ep local experts on the host (``l_ex``:
    ``ParallelSpec.expert_gemm``): fc1 and fc2 per expert forward, their data and weight
    gradients backward, plus the forward's again under full recomputation; 0 otherwise."""
    forward = l_ex * routed_blocks(model, par) * E_r / N_ep * EXPERT_LINEARS
    again = checkpointed_share(train) * forward if train.recompute == "full" else 0
    return forward, 2 * forward + again


def sync_idle(
    model: ModelSpec, train: TrainSpec, par: ParallelSpec, after_device: sp.Expr
) -> tuple:
    """(forward, backward) seconds of one micro-batch the device idles at its MoE layers'
    host syncs, where a dropless layer reads its token counts on the host (expert
    parallelism, or a per-expert loop without it): per routed block, the host seconds of
    what follows the sync (:func:`after_sync_host`) beyond ``after_device``'s share (the
    device seconds of this stage's routed experts and their dispatch, per micro-batch), at
    least one launch; the recomputed forward's again under full recomputation. Where kernels
    run on the dispatching thread (CPU) the host's time already adds: one launch per sync.
    0 for a dense model, a dispatch padded to its capacity (``capacity_pad``) and a step
    replayed from one graph."""
    blocks = routed_blocks(model, par)
    syncs = (1 - smin(c_pad, 1)) * smax(l_ex, more_than_one(N_ep)) * (1 - g_full)
    after = blocks * after_sync_host(model, par)
    idle = s_sync * blocks * t_op + (1 - s_sync) * smax(after - after_device, blocks * t_op)
    forward = syncs * idle
    again = checkpointed_share(train) * forward if train.recompute == "full" else 0
    return forward, again


def after_sync_host(model: ModelSpec, par: ParallelSpec) -> sp.Expr:
    """Host seconds of one routed block's forward after its sync: its FFN kind's kernels
    with fused regions (the permutations, the shared experts; the router's comes before),
    one per expert matrix (the grouped GEMMs) and the expert GEMMs a per-expert loop
    launches (:func:`expert_launches`' per block); 0 for a dense model."""
    kinds = [kind for kind, _ in device_blocks(model, par) if kind.routes]
    if not kinds:
        return integer(0)
    kernels = kinds[0].fused_kernels(model)[0] - 1 + dense.matrices(model)
    return kernels * t_op + l_ex * E_r / N_ep * EXPERT_LINEARS * t_ex
