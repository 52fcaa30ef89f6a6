"""The reference model cut into pipeline stages and run by ``torch.distributed.pipelining``.

Each rank builds the whole reference model (same seed on every rank), keeps the layers of
its stages and drops the rest: the first stage has the embedding, the last the final norm
and the head; the loss (fp32 cross-entropy of the logits, as ``TransformerLM.forward``)
is the schedule's ``loss_fn``, run on the last stage per micro-batch. Stages are assigned
to ranks as torch's schedules expect: one per rank (``1f1b``, ``gpipe``), or ``v`` per rank
in a loop (``interleaved``: rank r holds stages r, r + pp, ...; Narayanan et al. 2021,
Sec. 2.2). ``layers`` (blocks per stage, first to last) may be uneven; by default the
blocks are split as evenly as they go, the earlier stages taking the extra ones.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    _PipelineSchedule,
)

from costmodel import ModelSpec, ParallelSpec, TrainSpec, get_hardware
from costmodel.engine.estimate import symbol_values
from costmodel.frameworks import framework_of
from costmodel.parallel.distributed import rank_memory
from costmodel.parallel.pipeline import PipelineRank
from costmodel.symbols.algebra import by_symbol
from costmodel.symbols.core import as_expr
from validate.distributed.checks import small_spec
from validate.probes.live import LiveBytes, optimizer_state, state_bytes
from validate.reference.model import TransformerLM

SCHEDULES = ("1f1b", "gpipe", "interleaved")


def even_layers(n_layers: int, stages: int) -> tuple[int, ...]:
    """Blocks per stage, as even as they go, the earlier stages taking the extra ones."""
    if stages > n_layers:
        raise ValueError(f"stages ({stages}) must not exceed n_layers ({n_layers})")
    base, extra = divmod(n_layers, stages)
    return tuple(base + (i < extra) for i in range(stages))


class StageModule(nn.Module):
    """Blocks ``start:stop`` of ``model`` (the embedding before them on the first stage,
    the final norm and head after them on the last). Takes token ids on the first stage,
    the residual stream otherwise; returns the residual stream, or the logits."""

    def __init__(self, model: TransformerLM, start: int, stop: int) -> None:
        super().__init__()
        if model.spec.ffn_only:
            raise ValueError("pipeline stages need an embedding and a head (ffn_only spec)")
        self.spec, self.compute, self.attention = model.spec, model.compute, model.attention
        self.recompute, self.dropout = model.recompute, model.dropout
        self.finetune = model.finetune
        self.first, self.last = start == 0, stop == model.spec.n_layers
        self.blocks = nn.ModuleList(model.blocks[start:stop])
        self.embed = model.embed if self.first else None
        self.pos = getattr(model, "pos", None) if self.first else None
        self.norm_f = model.norm_f if self.last else None
        self.lm_head = model.lm_head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = TransformerLM._embed(self, x)  # type: ignore[arg-type]
        tables = TransformerLM._tables(self, x.shape[1], x.device)  # type: ignore[arg-type]
        x = TransformerLM._run_blocks(self, x, *tables)  # type: ignore[arg-type]
        if self.lm_head is None:
            return x
        return self.lm_head(self.norm_f(x).to(self.compute))


def stage_indices(rank: int, world: int, schedule: str, virtual: int) -> list[int]:
    """The stages ``rank`` holds: its own, or under ``interleaved`` r, r + world, ..."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)} (got {schedule!r})")
    per_rank = virtual if schedule == "interleaved" else 1
    return [rank + world * i for i in range(per_rank)]


def build_stages(
    model: TransformerLM,
    rank: int,
    world: int,
    schedule: str,
    virtual: int = 1,
    layers: Sequence[int] | None = None,
) -> list[StageModule]:
    """This rank's stage modules; what ``model`` had beyond them is dropped (freed once
    the caller lets ``model`` go)."""
    indices = stage_indices(rank, world, schedule, virtual)
    n_stages = world * len(indices)
    layers = tuple(layers) if layers is not None else even_layers(model.spec.n_layers, n_stages)
    if len(layers) != n_stages or sum(layers) != model.spec.n_layers or min(layers) < 1:
        raise ValueError(f"layers {layers} must give each of {n_stages} stages at least one of "
                         f"the model's {model.spec.n_layers} blocks")  # fmt: skip
    starts = [sum(layers[:i]) for i in range(n_stages + 1)]
    return [StageModule(model, starts[i], starts[i + 1]) for i in indices]


def loss_fn(vocab: int):
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    return loss


def make_schedule(
    modules: list[StageModule],
    rank: int,
    world: int,
    schedule: str,
    micro_batches: int,
    device: torch.device,
) -> _PipelineSchedule:
    """torch's schedule over this rank's stages (PipelineStage, metadata inferred from the
    first step's real micro-batches)."""
    n_stages = world * len(modules)
    indices = stage_indices(rank, world, schedule, len(modules))
    stages = [PipelineStage(m, i, n_stages, device, group=dist.group.WORLD)
              for m, i in zip(modules, indices, strict=True)]  # fmt: skip
    loss = loss_fn(modules[0].spec.vocab)
    if schedule == "interleaved":
        return ScheduleInterleaved1F1B(stages, micro_batches, loss_fn=loss)
    kind = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
    return kind(stages[0], micro_batches, loss_fn=loss)


def run_step(
    sched: _PipelineSchedule, modules: list[StageModule], ids: torch.Tensor, targets: torch.Tensor
) -> list[torch.Tensor]:
    """One forward and backward of the whole batch through the pipeline; the last stage's
    micro-batch losses (an empty list elsewhere). With ``return_outputs=False`` the last
    stage keeps no logits for the caller (by default torch keeps every micro-batch's
    output until the next step and concatenates them at the end of this one)."""
    args = (ids,) if any(m.first for m in modules) else ()
    losses: list[torch.Tensor] = []
    kwargs = {"target": targets, "losses": losses} if any(m.last for m in modules) else {}
    sched.step(*args, return_outputs=False, **kwargs)
    return losses


# Per-rank memory under a pipeline schedule


@dataclass(frozen=True)
class PipelineCase:
    """A pipeline run: ``world`` ranks, ``virtual`` stages each under ``interleaved``, the
    reference model of ``n_layers`` blocks (``checks.small_spec`` otherwise) split as
    costmodel splits it (:func:`even_layers`), ``micro_batches`` per step."""

    schedule: str = "1f1b"
    world: int = 2
    virtual: int = 1
    n_layers: int = 4
    micro_batches: int = 4
    batch: int = 8
    seq: int = 64
    precision: str = "fp32"
    experts: int = 0
    """Routed experts (top-2, one shared, the first block dense); 0: the dense model."""

    @property
    def name(self) -> str:
        v = f"x{self.virtual}" if self.schedule == "interleaved" else ""
        shape = f"pp{self.world}/L{self.n_layers}/m{self.micro_batches}"
        moe = f"/moe{self.experts}" if self.experts else ""
        return f"{self.schedule}{v}/{shape}/{self.precision}{moe}"

    def spec(self) -> ModelSpec:
        spec = small_spec().replace(n_layers=self.n_layers)
        if not self.experts:
            return spec
        return spec.replace(n_experts=self.experts, experts_per_token=2, d_ff_expert=64,
                            n_shared_experts=1, dense_layers=1)  # fmt: skip

    def train(self) -> TrainSpec:
        return TrainSpec(batch=self.batch, seq=self.seq, precision=self.precision,
                         grad_accum=self.micro_batches, elementwise="eager")  # fmt: skip

    def parallel(self) -> ParallelSpec:
        return ParallelSpec(pp=self.world, pp_interleave=self.virtual)


PIPELINE_MEASURED = ("params", "grads", "optimizer", "buffers", "peak_forward_backward", "peak")


def measure(rank: int, world: int, case: PipelineCase, timed: bool = False) -> dict[str, float]:
    """This rank's state bytes, the buffers the schedule keeps across steps, and the
    high-water marks of a step without optimizer state (``peak_forward_backward``) and
    of one with it, optimizer step included (``peak``). A first step, not measured, lets
    torch infer the stages' metadata (it runs a forward and backward of its own). With
    ``timed``, ``step_s``: the median of three more whole steps, outside the memory probe."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")  # fmt: skip
    mem, out = LiveBytes(device), {}
    with mem:
        torch.manual_seed(0)
        model = TransformerLM.for_training(case.spec(), case.train(), device)
        modules = build_stages(model, rank, world, case.schedule, case.virtual)
        del model
        gc.collect()
        params = [p for mod in modules for p in mod.parameters()]
        mem.hold(params)
        sched = make_schedule(modules, rank, world, case.schedule, case.micro_batches, device)
        opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
        g = torch.Generator(device=device).manual_seed(1)
        shape = (case.batch, case.seq)
        for i in range(3):
            ids, targets = (torch.randint(case.spec().vocab, shape, device=device, generator=g)
                            for _ in range(2))  # fmt: skip
            gc.collect()
            mem.reset_peak()
            run_step(sched, modules, ids, targets)
            out["grads"] = state_bytes(p.grad for p in params if p.grad is not None)
            if i == 1:
                out["peak_forward_backward"] = mem.peak()
            if i > 0:
                opt.step()
            opt.zero_grad(set_to_none=True)
            out["peak"] = mem.peak()
            del ids, targets
        gc.collect()
        out["params"] = state_bytes(params)
        out["optimizer"] = state_bytes(t for t in optimizer_state(opt) if t.dim() > 0)
        out["buffers"] = mem.now() - out["params"] - out["optimizer"] - _scalars(opt)
    if timed:
        out["step_s"] = _step_seconds(sched, modules, opt, case, g, device)
    return out


def _step_seconds(sched, modules, opt, case: PipelineCase, g, device: torch.device) -> float:
    """Median seconds of three training steps (CUDA synchronized around each)."""
    times = []
    for _ in range(3):
        ids, targets = (torch.randint(case.spec().vocab, (case.batch, case.seq), device=device,
                                      generator=g) for _ in range(2))  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run_step(sched, modules, ids, targets)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def _scalars(opt: torch.optim.Optimizer) -> int:
    """Bytes of Adam's scalar ``step`` counters (state costmodel does not count)."""
    return state_bytes(t for t in optimizer_state(opt) if t.dim() == 0)


def predicted(case: PipelineCase) -> list[dict[str, float]]:
    """costmodel's numbers for each rank (``costmodel.parallel.distributed.rank_memory``)."""
    spec, train, par = case.spec(), case.train(), case.parallel()
    values = symbol_values(spec, train, par, get_hardware("cpu"))
    out = []
    for r in range(case.world):
        rank = PipelineRank(r, r == 0, r == case.world - 1)
        mem = {k: float(as_expr(e).xreplace(by_symbol(values))) for k, e in
               rank_memory(spec, train, par, rank, pricing=framework_of(par)).items()}  # fmt: skip
        # a rank's parameter storages are the fp32 master where autocast casts from it
        mem["params"] = mem["master"] or mem["params"]
        out.append({k: mem[k] for k in PIPELINE_MEASURED})
    return out
