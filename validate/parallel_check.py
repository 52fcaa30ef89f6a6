"""The reference model under FSDP2 and under DTensor tensor parallelism, one training step
per rank, with every collective counted (``validate.comm_count``).

FSDP: ``fully_shard`` on the embedding, each block, the final norm and the head, then the
root (which then holds no parameters of its own: FSDP2 keeps a root's parameters gathered
between forward and backward, which ZeRO-3 accounting does not assume). TP: Megatron's
layout with torch's styles: the attention and FFN inputs are prepared once as replicated
DTensors (Megatron's f: identity forward, one all-reduce backward), q/k/v and the FFN's
up-projections column-parallel, the output projections row-parallel (g: one all-reduce
forward); embedding and head replicated.
"""

from __future__ import annotations

import time

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

from costmodel import ModelSpec, TrainSpec, get_model
from validate.comm_count import CollectiveCounter
from validate.model import TransformerLM, make_batch


def small_spec() -> ModelSpec:
    """A Llama-style model small enough for CPU ranks; even sizes (no FSDP padding)."""
    return get_model("cs336-small").replace(vocab=256, d_model=128, n_heads=4, n_layers=2, d_ff=256)


def _prepared(layouts: int) -> PrepareModuleInput:
    rest = (None,) * (layouts - 1)
    return PrepareModuleInput(
        input_layouts=(Replicate(), *rest),
        desired_input_layouts=(Replicate(), *rest),
        use_local_output=False,
    )


def shard(model: TransformerLM, kind: str, world: int) -> None:
    device = next(model.parameters()).device.type
    mesh = init_device_mesh(device, (world,))
    if kind == "fsdp":
        for module in [model.embed, *model.blocks, model.norm_f, model.lm_head]:
            fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return
    plan = {
        "attn": _prepared(4),
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(),
        "ffn": _prepared(1),
        "ffn.w1": ColwiseParallel(),
        "ffn.w3": ColwiseParallel(),
        "ffn.w2": RowwiseParallel(),
    }
    for block in model.blocks:
        parallelize_module(block, mesh, plan)


def step(rank: int, world: int, kind: str, batch: int, seq: int, precision: str) -> dict:
    """One forward and backward under ``kind``; collectives counted, seconds timed."""
    torch.manual_seed(0)
    spec, train = small_spec(), TrainSpec(batch=batch, seq=seq, precision=precision)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = TransformerLM.for_training(spec, train, device)
    shard(model, kind, world)
    g = torch.Generator(device=device).manual_seed(1 + (rank if kind == "fsdp" else 0))
    data = make_batch(model, batch // world if kind == "fsdp" else batch, seq, device, g)
    model(data).backward()  # warm-up
    model.zero_grad()
    counter = CollectiveCounter()
    start = time.perf_counter()
    with counter:
        model(data).backward()
    seconds = time.perf_counter() - start
    return {
        "calls": dict(counter.calls),
        "sizes": dict(counter.sizes),
        "ring_bytes": counter.ring_bytes(world),
        "seconds": seconds,
    }


def unsharded_step(batch: int, seq: int, precision: str) -> float:
    """Seconds of the same step on one process (the baseline for the overhead)."""
    torch.manual_seed(0)
    spec, train = small_spec(), TrainSpec(batch=batch, seq=seq, precision=precision)
    model = TransformerLM.for_training(spec, train, "cpu")
    data = make_batch(model, batch, seq)
    model(data).backward()
    start = time.perf_counter()
    model(data).backward()
    return time.perf_counter() - start


def spec_and_train(batch: int, seq: int, precision: str) -> tuple[ModelSpec, TrainSpec]:
    return small_spec(), TrainSpec(batch=batch, seq=seq, precision=precision)
