"""Per-rank memory and time of real training steps under each layout costmodel predicts.

Each rank builds the reference model (``checks.small_spec``), lays it out, trains two steps
of AdamW (foreach) on its share of the global batch and reports what it held, measured by
``validate.probes.live.LiveBytes`` (CUDA's allocator counters; on CPU every live storage):

- ``params``, ``grads``, ``optimizer``: bytes of this rank's parameter storages, gradients
  after backward and optimizer moments (a DTensor's local shard; Adam's scalar ``step``
  counters, 4 bytes per parameter tensor, are not state costmodel counts);
- ``after_forward``: live bytes the forward pass added (what backward keeps: activations,
  and the working weights a layout holds from forward to backward);
- ``peak_forward`` and ``peak_forward_backward``: high-water marks of the first step's
  forward and forward + backward (no gradients or optimizer state yet), and ``peak``:
  the second step's, optimizer step included; costmodel's definitions;
- ``step_s``: the median of three more steps' seconds, timed outside the memory probe
  (CUDA synchronized around each).

Layouts, each as the framework that runs it:

- ``ddp``: torch ``DistributedDataParallel`` (gradient buckets of ``bucket_cap_mb``);
- ``zero1``: the same with ``validate.distributed.ddp.ShardedOptimizer`` (ZeRO-1);
- ``fsdp2`` / ``fsdp2-noreshard``: ``fully_shard`` on the embedding, every block, the final
  norm, the head and the root, with ``reshard_after_forward`` on / off; under a mixed
  precision a ``MixedPrecisionPolicy`` (compute dtype parameters, fp32 reduction);
- ``fsdp-by-hand``: ``validate.fsdp.FSDP`` (one matrix gathered at a time, fp32 shards;
  under a mixed precision gathered and computed in the compute dtype), costmodel's
  ``framework="handwritten"``; on gloo its collectives return once gloo has released
  their tensors (:func:`settled`);
- ``tp`` / ``tp-sp``: DTensor tensor parallelism (``checks.tp_plans``: vocabulary-parallel
  embedding and head, the loss under ``loss_parallel``), without / with sequence
  parallelism; every rank runs the whole batch;
- ``cp``: ring attention (``validate.distributed.context``) under DDP;
- ``ep`` (a mixture-of-experts model only): expert parallelism over every rank
  (``validate.distributed.expert``, balanced routing) under DDP, which leaves the routed
  experts alone (each rank's are different experts); ``ep-fsdp2``: the same under FSDP2
  as torchtitan applies it (each block's experts a unit of their own over the shard ranks
  the ep group leaves, here one; the rest over every rank).

``sent_bytes``: what the ring (``cp``) or the all-to-alls (``ep``) sent to other ranks in
the second step, against ``comm_bytes.cp`` / ``comm_bytes.ep``; ``imbalance``: the
routed pairs this rank's experts received in that step over those its own tokens made
(1 under balanced routing; costmodel's ``ep_imbalance`` on the busiest rank).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from costmodel import ModelSpec, ParallelSpec, TrainSpec
from costmodel.single.precision import PRECISIONS
from validate.distributed import context, expert
from validate.distributed.checks import (
    fully_shard_model,
    parallel_spec,
    small_spec,
    tensor_parallel,
)
from validate.distributed.context import ContextParallelLM, local_chunk
from validate.distributed.ddp import ShardedOptimizer
from validate.fsdp import FSDP, all_gather
from validate.probes.live import LiveBytes, optimizer_state, state_bytes
from validate.reference.model import TransformerLM, dtypes_for, make_batch

LAYOUTS = ("ddp", "zero1", "fsdp2", "fsdp2-noreshard", "fsdp-by-hand", "tp", "tp-sp", "cp")
MOE_LAYOUTS = ("ep", "ep-fsdp2")  # layouts only a mixture-of-experts model has
SENDS = {"cp": context.SENT, "ep": expert.SENT, "ep-fsdp2": expert.SENT}
TENSOR_PARALLEL = ("tp", "tp-sp")
WHOLE_BATCH = (*TENSOR_PARALLEL, "cp")  # every rank runs every sequence (cp: its chunk)
STATE = ("params", "grads", "optimizer")
PEAKS = ("peak_forward", "peak_forward_backward", "peak")
MEASURED = (*STATE, "after_forward", *PEAKS)


@dataclass(frozen=True)
class LayoutCase:
    layout: str
    world: int = 2
    batch: int = 4
    seq: int = 64
    precision: str = "fp32"
    experts: int = 0
    """Routed experts (top-2, one shared; three blocks, the first dense); 0: the dense
    model."""
    routing: str = "balanced"
    """Under ``ep``: ``balanced`` (round robin: every rank gets its share), ``topk`` (the
    router's choice) or ``one-rank`` (every pair to the first rank's experts)."""
    capacity: float = 0.0
    """Under ``ep``: an expert's capacity over the mean, pairs past it dropped; 0: dropless."""

    @property
    def name(self) -> str:
        moe = f"/moe{self.experts}" if self.experts else ""
        if self.layout in MOE_LAYOUTS:
            moe += "" if self.routing == "balanced" else f"/{self.routing}"
            moe += f"/capacity{self.capacity:g}" if self.capacity else ""
        return f"{self.layout}/world{self.world}/{self.precision}{moe}"

    def spec(self) -> ModelSpec:
        """``checks.small_spec``, or with ``experts`` its mixture-of-experts version."""
        if not self.experts:
            return small_spec()
        return small_spec().replace(n_layers=3, n_experts=self.experts, experts_per_token=2,
                                    d_ff_expert=64, n_shared_experts=1, dense_layers=1)  # fmt: skip

    def train(self) -> TrainSpec:
        # the reference model runs eager
        return TrainSpec(batch=self.batch, seq=self.seq, precision=self.precision,
                         elementwise="eager")  # fmt: skip

    def parallel(self) -> ParallelSpec:
        """The layout as costmodel names it (FSDP2 reduces in fp32 under a mixed precision,
        as :func:`_fsdp2`'s ``MixedPrecisionPolicy`` says; the hand-written FSDP and TP as
        ``checks.parallel_spec`` names the suites' kinds)."""
        w, mixed = self.world, PRECISIONS[self.precision].weight_copy > 0
        return {
            "ddp": ParallelSpec(dp=w),
            "cp": ParallelSpec(cp=w),
            "ep": ParallelSpec(dp=w, ep=w, capacity_factor=self.capacity),
            "ep-fsdp2": ParallelSpec(
                fsdp=w,
                ep=w,
                framework="fsdp2",
                grad_reduce_fp32=mixed,
                capacity_factor=self.capacity,
            ),
            "zero1": ParallelSpec(fsdp=w, zero=1),
            "fsdp2": ParallelSpec(fsdp=w, framework="fsdp2", grad_reduce_fp32=mixed),
            "fsdp2-noreshard": ParallelSpec(
                fsdp=w, framework="fsdp2", grad_reduce_fp32=mixed, reshard_after_forward=False
            ),
        }.get(self.layout) or parallel_spec(self.layout, w)

    def local_batch(self) -> int:
        """Sequences each rank runs: its share of the batch, the whole batch under TP and
        CP (a chunk of each sequence)."""
        return self.batch if self.layout in WHOLE_BATCH else self.batch // self.world

    def data(self, model: TransformerLM, device: torch.device, g: torch.Generator, rank: int):
        """This rank's batch: ids and targets (b, T), under CP its chunk of the sequence."""
        data = make_batch(model, self.local_batch(), self.seq, device, g)
        return local_chunk(data, rank, self.world) if self.layout == "cp" else data


class InPlaceReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter as an in-place all-reduce of its own flat input buffer and a
    copy of this rank's chunk, for gloo. Gloo has no native reduce-scatter: its emulation
    reduces a private copy of the whole input, which its worker thread releases at a racy
    moment (measured: one layer's fp32 gradients held into the next layer's all-gather on
    1 rank in ~50), so peaks varied run to run. NCCL reduce-scatters without such a copy;
    with this comm a gloo rank holds what an NCCL rank holds: FSDP2's own buffers. Sends
    twice a reduce-scatter's bytes, so only the memory measurement uses it."""

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False) -> None:
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ValueError(f"InPlaceReduceScatter: op must be SUM or AVG, got {op}")
        dist.all_reduce(input_tensor, group=group)
        world = dist.get_world_size(group)
        output_tensor.copy_(input_tensor.view(world, -1)[dist.get_rank(group)])
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(world)


def _uses(t: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def settled(collective: Callable[..., Any]) -> Callable[..., None]:
    """``collective(*tensors)`` that returns only once gloo's worker thread has dropped
    its references to the tensors' storages. Gloo completes a collective before its worker
    releases the work holding them, so a tensor the caller frees right after (the
    hand-written FSDP's gathered weights and gradient buffers) can live on for a moment
    that races the caller's next ops; the live-bytes count then varies run to run."""

    def run(*tensors: torch.Tensor) -> None:
        before = [_uses(t) for t in tensors]
        collective(*tensors)
        deadline = time.monotonic() + 60.0
        while any(_uses(t) > n for t, n in zip(tensors, before, strict=True)):
            if time.monotonic() > deadline:
                raise RuntimeError("gloo kept a collective's tensors for over 60 s")
            time.sleep(0)

    return run


def _in_place_reduce_scatter(output: torch.Tensor, input_tensor: torch.Tensor) -> None:
    InPlaceReduceScatter()(output, input_tensor, dist.group.WORLD, dist.ReduceOp.SUM)


def _fsdp2(
    model: TransformerLM, world: int, precision: str, reshard: bool, experts: bool = False
) -> None:
    """FSDP2 over ``world`` ranks; ``experts``: each MoE block's routed experts (split over
    the ranks by expert parallelism) wrapped first over the shard ranks the ep group
    leaves, one here (torchtitan's dp_shard_mod_ep mesh)."""
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (1, world), mesh_dim_names=("mod_ep", "in_ep"))
    kw: dict = {"reshard_after_forward": reshard}
    _, compute = dtypes_for(precision)
    if compute != torch.float32:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    if experts:
        for block in model.blocks:
            if isinstance(block.ffn, expert.ExpertParallelMoE):
                fully_shard(list(block.ffn.experts), mesh=mesh["mod_ep"], **kw)
    fully_shard_model(model, mesh["in_ep"], **kw)
    if device.type == "cpu":
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(InPlaceReduceScatter())


def build(case: LayoutCase, device: torch.device) -> tuple[nn.Module, TransformerLM]:
    """(what the step calls, the reference model inside it), laid out as ``case`` says."""
    torch.manual_seed(0)
    model = TransformerLM.for_training(case.spec(), case.train(), device)
    if case.layout == "ddp" and case.world == 1:  # one replica is trained unwrapped (dp 1)
        return model, model
    if case.layout in ("ddp", "zero1"):
        return DistributedDataParallel(model), model
    if case.layout == "fsdp-by-hand":
        _, compute = dtypes_for(case.precision)
        dtype = None if compute == torch.float32 else compute
        if device.type != "cpu":
            return FSDP(model, dtype), model
        # gloo's own reduce-scatter reduces a private copy of its input (FSDP2's case, above)
        gather, scatter = settled(all_gather), settled(_in_place_reduce_scatter)
        return FSDP(model, dtype, all_gather=gather, reduce_scatter=scatter), model
    if case.layout == "cp":  # ring attention; DDP averages gradients over the cp ranks
        return DistributedDataParallel(ContextParallelLM(model)), model
    if case.layout == "ep-fsdp2":  # torchtitan: experts over the shard ranks ep leaves
        expert.expert_parallel(model, routing=case.routing, capacity=case.capacity)
        _fsdp2(model, case.world, case.precision, reshard=True, experts=True)
        return model, model
    if case.layout == "ep":  # DDP averages the rest; each rank's experts are its own
        routed = expert.expert_parallel(model, routing=case.routing, capacity=case.capacity)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, routed)
        return DistributedDataParallel(model), model
    if case.layout in TENSOR_PARALLEL:
        mesh = init_device_mesh(device.type, (case.world,))
        tensor_parallel(model, mesh, sequence_parallel=case.layout == "tp-sp")
        return model, model
    _fsdp2(model, case.world, case.precision, reshard=case.layout == "fsdp2")
    return model, model


def _optimizer(case: LayoutCase, model: nn.Module) -> torch.optim.Optimizer:
    params = list(model.parameters())
    if case.layout == "zero1":
        return ShardedOptimizer(params, torch.optim.AdamW, lr=1e-3, foreach=True)
    # foreach kernels take one kind of tensor per call: DTensors (TP's sharded matrices)
    # and plain tensors (norms left replicated without sequence parallelism) in two groups
    groups = [[p for p in params if isinstance(p, DTensor) == d] for d in (True, False)]
    return torch.optim.AdamW([{"params": g} for g in groups if g], lr=1e-3, foreach=True)


def _moments(opt: torch.optim.Optimizer) -> int:
    if isinstance(opt, ShardedOptimizer):
        return opt.state_bytes()
    return state_bytes(t for t in optimizer_state(opt) if t.dim() > 0)


def measure(rank: int, world: int, case: LayoutCase, timed: bool = True) -> dict[str, float]:
    """One rank's bytes and seconds (module docstring; ``step_s`` only when ``timed``);
    runs inside ``launch``."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")  # fmt: skip
    mem = LiveBytes(device)
    out: dict[str, float] = {}
    tp = case.layout in TENSOR_PARALLEL
    same = case.layout in WHOLE_BATCH  # every rank draws the same sequences
    g = torch.Generator(device=device).manual_seed(1 + (0 if same else rank))
    with mem:
        step, model = build(case, device)
        mem.hold([*step.parameters(), *step.buffers()])
        opt = _optimizer(case, step)
        for i in range(2):
            data = case.data(model, device, g, rank)
            sends = SENDS.get(case.layout, {"bytes": 0})
            sent, routed = sends["bytes"], dict(expert.ROUTED)
            gc.collect()  # the last step's reference cycles, freed whenever gc next ran
            mem.reset_peak()
            before = mem.now()
            with loss_parallel() if tp else nullcontext():
                loss = step(data)
            gc.collect()  # FSDP2's finished all-gather records can sit in reference cycles
            out["after_forward"] = mem.now() - before
            if i == 0:
                out["peak_forward"] = mem.peak()
            _backward(step, loss, tp)
            del loss
            if i == 0:
                out["peak_forward_backward"] = mem.peak()
            out["grads"] = state_bytes(p.grad for p in step.parameters() if p.grad is not None)
            _update(opt)
            out["peak"] = mem.peak()
            out["sent_bytes"] = sends["bytes"] - sent
            own = expert.ROUTED["own"] - routed["own"]  # this step's forward
            out["imbalance"] = (expert.ROUTED["received"] - routed["received"]) / max(own, 1)
        out["params"] = state_bytes(step.parameters())
        out["optimizer"] = _moments(opt)
    if timed:
        out["step_s"] = _step_seconds(case, step, model, opt, device, g, rank)
    return out


def measure_least(rank: int, world: int, case: LayoutCase, runs: int = 2) -> dict[str, float]:
    """:func:`measure`'s bytes ``runs`` times over in this process (the layout built anew
    each time), the smallest of each: gloo's worker threads sometimes release a
    collective's tensors late, so a run now and then holds one more gathered matrix at a
    peak (never one too few); NCCL holds no such reference. Untimed."""
    results = [measure(rank, world, case, timed=False) for _ in range(runs)]
    return {k: min(r[k] for r in results) for k in results[0]}


def _backward(step: nn.Module, loss: torch.Tensor, tp: bool) -> None:
    with loss_parallel() if tp else nullcontext():
        loss.backward()
    if isinstance(step, FSDP):
        step.finish_gradient_synchronization()


def _update(opt: torch.optim.Optimizer) -> None:
    opt.step()
    opt.zero_grad(set_to_none=True)


def _step_seconds(case: LayoutCase, step: nn.Module, model: TransformerLM, opt, device, g,
                  rank: int, steps: int = 3) -> float:  # fmt: skip
    """Median seconds of a whole training step, timed apart from the memory probe (on CPU
    its dispatch mode inspects every op), CUDA synchronized around each."""
    tp, times = case.layout in TENSOR_PARALLEL, []
    for _ in range(steps):
        data = case.data(model, device, g, rank)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with loss_parallel() if tp else nullcontext():
            loss = step(data)
        _backward(step, loss, tp)
        _update(opt)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def predicted(case: LayoutCase, values: dict[str, float]) -> dict[str, float]:
    """costmodel's per-device numbers for what :func:`measure` reports: the rank's parameter
    storages are costmodel's ``master`` where it keeps one apart from the working weights,
    else its ``params``; after forward a rank holds the activations plus the working weights
    it keeps until backward (autocast-style casts in the reference model, every gathered
    layer under FSDP2 without ``reshard_after_forward``)."""
    mem = {k.split(".", 1)[1]: v for k, v in values.items()
           if k.startswith("memory_bytes_per_device.")}  # fmt: skip
    par, prec = case.parallel(), PRECISIONS[case.precision]
    kept = mem["params"] if par.framework == "reference" and prec.weight_copy else 0
    if par.framework == "fsdp2" and not par.reshard_after_forward:
        # every unit stays unsharded: the rank's fp32 shards times the ranks, in the
        # compute dtype (``params`` adds the flat all-gather buffer in flight)
        kept = mem["master"] * case.world * prec.activation // prec.param
    return {
        "params": mem["master"] if mem["master"] else mem["params"],
        "grads": mem["grads"],
        "optimizer": mem["optimizer"],
        "after_forward": mem["activations"] + kept,
        **{k: mem[k] for k in PEAKS},
    }
