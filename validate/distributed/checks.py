"""The checks the distributed suites and torchrun run on each rank.

Data parallelism: training steps under each hand-written wrapper (``validate.distributed.ddp``)
on a small model with a tied embedding/head, a frozen layer and a buffer; every rank trains
on its slice of the same global batch, so averaged gradients equal the single-process ones.

FSDP and TP: the reference model under FSDP2 and under DTensor tensor parallelism, one
training step per rank, with every collective counted (``validate.probes.comm_count``).
FSDP: ``fully_shard`` on the embedding, each block, the final norm with the head, then the
root (which then holds no parameters of its own: FSDP2 keeps a root's parameters gathered
between forward and backward, which ZeRO-3 accounting does not assume). TP: Megatron's
layout with torch's styles, vocabulary-parallel embedding and head, with or without
sequence parallelism (:func:`tp_plans`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from costmodel import ModelSpec, ParallelSpec, TrainSpec, get_model
from validate.distributed.ddp import BucketedDDP, FlatDDP, NaiveDDP, OverlapDDP, ShardedOptimizer
from validate.fsdp import FSDP
from validate.probes.comm_count import CollectiveCounter
from validate.reference.model import TransformerLM, make_batch

VOCAB, DIM = 64, 32
FROZEN_PARAMS = DIM * DIM + DIM  # TiedToy.frozen (weight and bias), at the default width


class TiedToy(nn.Module):
    def __init__(self, depth: int = 3, dim: int = DIM) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter
        self.register_buffer("scale", torch.ones(()))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return self.head(self.frozen(x) * self.scale)


def batches(steps: int, batch: int = 8, seq: int = 12) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(VOCAB, (batch, seq + 1), generator=g) for _ in range(steps)]


def _loss(model: nn.Module, data: torch.Tensor) -> torch.Tensor:
    logits = model(data[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1))


def reference_params(steps: int) -> list[torch.Tensor]:
    """Single process, whole batch."""
    torch.manual_seed(0)
    model = TiedToy()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for data in batches(steps):
        opt.zero_grad()
        _loss(model, data).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def wrap(variant: str, model: nn.Module) -> nn.Module:
    if variant == "bucketed":
        return BucketedDDP(model, bucket_size_mb=0.01)  # several buckets for this toy
    return {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP}[variant](model)


def ddp_params(rank: int, world: int, variant: str, steps: int, sharded: bool) -> dict:
    """Train under ``variant`` on this rank's slice; parameters and optimizer state bytes."""
    torch.manual_seed(0 if rank == 0 else 100 + rank)  # rank 0 as the reference; the
    model = wrap(variant, TiedToy())  # wrapper's broadcast must fix the other ranks
    params = [p for p in model.parameters() if p.requires_grad]
    if sharded:
        opt = ShardedOptimizer(params, torch.optim.AdamW, lr=1e-2)
    else:
        opt = torch.optim.AdamW(params, lr=1e-2)
    for data in batches(steps):
        local = data.chunk(world)[rank]
        opt.zero_grad()
        _loss(model, local).backward()
        model.finish_gradient_synchronization()
        opt.step()
    state = opt.state_bytes() if sharded else None
    return {"params": [p.detach().clone() for p in model.parameters()], "state_bytes": state}


def time_variant(
    rank: int, world: int, variant: str, steps: int, dim: int, bucket_mb: float
) -> dict:
    """Seconds per step and in ``finish_gradient_synchronization`` (median over steps)."""
    torch.manual_seed(0)
    module = TiedToy(depth=6, dim=dim)
    model = BucketedDDP(module, bucket_mb) if variant == "bucketed" else wrap(variant, module)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    step_times, sync_times = [], []
    for data in batches(steps + 2, batch=8 * world, seq=64):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        _loss(model, data.chunk(world)[rank]).backward()
        sync = time.perf_counter()
        model.finish_gradient_synchronization()
        done = time.perf_counter()
        opt.step()
        step_times.append(time.perf_counter() - start)
        sync_times.append(done - sync)
    step_times, sync_times = step_times[2:], sync_times[2:]
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    return {
        "step_s": sorted(step_times)[len(step_times) // 2],
        "sync_s": sorted(sync_times)[len(sync_times) // 2],
        "grad_sizes": sizes,
    }


# FSDP2 and tensor parallelism


def small_spec() -> ModelSpec:
    """A Llama-style model small enough for CPU ranks; even sizes (no FSDP padding)."""
    return get_model("cs336-small").replace(vocab=256, d_model=128, n_heads=4, n_layers=2, d_ff=256)


def tp_plans(sequence_parallel: bool) -> tuple[dict, dict]:
    """(plan for each block, plan for the model's own modules): Megatron's tensor-parallel
    layout in torch's styles, as torchtitan writes it. Blocks: the attention and FFN inputs
    become replicated DTensors (Megatron's f: identity forward, all-reduce backward), q/k/v
    and the FFN's up-projections column-parallel, the output projections row-parallel (g:
    all-reduce forward). Vocabulary-parallel embedding (row-parallel: each rank looks up
    its rows, an all-reduce sums them) and head (column-parallel, logits left sharded over
    the vocabulary for ``loss_parallel``'s cross-entropy: three all-reduces of fp32
    per-token scalars). Sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2): the
    residual stream and the norms are sharded over the sequence, each all-reduce becomes a
    reduce-scatter and an all-gather."""
    seq = Shard(1) if sequence_parallel else Replicate()
    rest = (None, None, None)  # rope tables and mask pass through untouched
    block: dict = {
        "attn": PrepareModuleInput(input_layouts=(seq, *rest),
                                   desired_input_layouts=(Replicate(), *rest)),
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=seq),
        "ffn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "ffn.w1": ColwiseParallel(),
        "ffn.w3": ColwiseParallel(),
        "ffn.w2": RowwiseParallel(output_layouts=seq),
    }  # fmt: skip
    top: dict = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1),
                                   use_local_output=False),
    }  # fmt: skip
    if sequence_parallel:
        block |= {"norm1": SequenceParallel(), "norm2": SequenceParallel()}
        top["norm_f"] = SequenceParallel()
    return block, top


def tensor_parallel(model: TransformerLM, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Lay ``model`` out over ``mesh`` with :func:`tp_plans`; run it under
    ``loss_parallel()`` (its logits are sharded over the vocabulary)."""
    block, top = tp_plans(sequence_parallel)
    for b in model.blocks:
        parallelize_module(b, mesh, block)
    parallelize_module(model, mesh, top)


def fully_shard_model(model: TransformerLM, mesh: DeviceMesh, **options: Any) -> None:
    """FSDP2 units as torchtitan groups them: the embedding, each block, the final norm
    with the head, then the root (``options``: ``fully_shard``'s, e.g.
    ``reshard_after_forward``, ``mp_policy``)."""
    for module in [model.embed, *model.blocks, [model.norm_f, model.lm_head]]:
        fully_shard(module, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)


def shard(model: TransformerLM, kind: str, world: int) -> nn.Module:
    """``kind``: ``fsdp`` (FSDP2), ``fsdp-by-hand`` (``validate.fsdp.FSDP``), ``tp`` or
    ``tp-sp`` (tensor parallel with sequence parallelism); returns what to call."""
    if kind == "fsdp-by-hand":
        return FSDP(model)
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (world,))
    if kind == "fsdp":
        fully_shard_model(model, mesh)
    else:
        tensor_parallel(model, mesh, sequence_parallel=kind == "tp-sp")
    return model


def parallel_spec(kind: str, world: int) -> ParallelSpec:
    """The layout :func:`shard` runs, as costmodel names it."""
    return {
        "fsdp": ParallelSpec(fsdp=world),
        "fsdp-by-hand": ParallelSpec(fsdp=world, framework="handwritten"),
        "tp": ParallelSpec(tp=world),
        "tp-sp": ParallelSpec(tp=world, sequence_parallel=True),
    }[kind]


def _forward_backward(run: nn.Module, data: Any) -> None:
    run(data).backward()
    if isinstance(run, FSDP):  # the replicated parameters' gradients
        run.finish_gradient_synchronization()


def step(rank: int, world: int, kind: str, batch: int, seq: int, precision: str) -> dict:
    """One forward and backward under ``kind``: its collectives (calls, full-tensor bytes, ring
    bytes one rank sends), the seconds this rank spent inside them (``comm_s``) and the
    step's seconds."""
    torch.manual_seed(0)
    spec, train = spec_and_train(batch, seq, precision)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = TransformerLM.for_training(spec, train, device)
    run = shard(model, kind, world)
    data_parallel = kind.startswith("fsdp")
    g = torch.Generator(device=device).manual_seed(1 + (rank if data_parallel else 0))
    data = make_batch(model, batch // world if data_parallel else batch, seq, device, g)
    with loss_parallel() if not data_parallel else nullcontext():
        _forward_backward(run, data)  # warm-up
        run.zero_grad()
        counter = CollectiveCounter()
        start = time.perf_counter()
        with counter:
            _forward_backward(run, data)
    seconds = time.perf_counter() - start
    return {
        "calls": dict(counter.calls),
        "sizes": dict(counter.sizes),
        "ring_bytes": counter.ring_bytes(world),
        "comm_s": counter.seconds,
        "seconds": seconds,
    }


def spec_and_train(batch: int, seq: int, precision: str) -> tuple[ModelSpec, TrainSpec]:
    return small_spec(), TrainSpec(batch=batch, seq=seq, precision=precision, elementwise="eager")
