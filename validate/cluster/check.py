"""``validate.cluster check``: a layout's real training steps on this cluster, against costmodel.

Every rank builds the reference model (``validate.reference``; the small Llama of
``validate.distributed.checks.small_spec``, or wider and deeper with ``--d-model`` and
``--layers``), lays it out as the named framework does (``validate.distributed.memory``:
torch DDP, ZeRO-1, FSDP2 with or without resharding, the hand-written FSDP, DTensor TP
with or without sequence parallelism, ring-attention CP), trains two steps measuring what
it holds and three more timed, and rank 0 compares each rank's step seconds and peak bytes
(and the other memory terms) with ``costmodel.estimate`` of the same layout on the profile
given (``--hardware``, e.g. the one ``calibrate`` wrote). A layout may come from
``costmodel plan --json`` (``--from-plan``): its first row's degrees and framework, over all
ranks on one axis (what ``validate.distributed.memory`` runs); the model stays the
reference one. Rows go to ``OUT/results.jsonl`` as ``validate.run`` writes them (and
``--resume`` skips a finished case).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from costmodel import ModelSpec, estimate
from costmodel.catalog.files import read_json
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from validate.distributed import memory, pipeline
from validate.distributed.checks import small_spec
from validate.distributed.memory import LayoutCase
from validate.distributed.pipeline import PipelineCase
from validate.report.results import ResultsLog, Row, rel_err

SUITE = "cluster"
LAYOUTS = (*memory.LAYOUTS, "pp")


def _wider(base: ModelSpec, d_model: int) -> ModelSpec:
    """``base`` at width ``d_model`` (0: unchanged): heads of 32, an FFN of 2·d_model."""
    if not d_model:
        return base
    return base.replace(d_model=d_model, n_heads=max(1, d_model // 32), d_ff=2 * d_model)


@dataclass(frozen=True)
class ClusterCase(LayoutCase):
    d_model: int = 0
    """0: ``small_spec``'s width (128); else heads of 32 and an FFN of 2·d_model."""
    n_layers: int = 0
    """0: ``small_spec``'s depth (2)."""

    def spec(self) -> ModelSpec:
        base = small_spec()
        return _wider(base.replace(n_layers=self.n_layers or base.n_layers), self.d_model)

    @property
    def name(self) -> str:
        spec = self.spec()
        return f"{super().name}/d{spec.d_model}x{spec.n_layers}/batch{self.batch}/seq{self.seq}"


@dataclass(frozen=True)
class ClusterPipeline(PipelineCase):
    """1F1B over every rank (``validate.distributed.pipeline``), 2 micro-batches per rank."""

    d_model: int = 0

    def spec(self) -> ModelSpec:
        return _wider(super().spec(), self.d_model)

    @property
    def name(self) -> str:
        return f"{super().name}/d{self.spec().d_model}/batch{self.batch}/seq{self.seq}"


def layout_from_plan(path: str, world: int) -> str:
    """The layout name of a plan's first row, if it spreads one axis over all ``world``
    ranks; a clear error otherwise."""
    data = read_json(path, "from-plan")
    rows = data.get("top") if isinstance(data, dict) else None
    if not rows or not isinstance(rows[0], dict):
        raise SpecError("from-plan", f"from-plan: {path} holds no plan rows ('top')")
    row = rows[0]
    degrees = {k: int(row.get(k, 1) or 1) for k in ("dp", "fsdp", "tp", "pp", "cp", "ep")}
    if degrees["ep"] == 1 and sum(d > 1 for d in degrees.values()) == 1:
        axis = next(k for k, d in degrees.items() if d > 1)
        if degrees[axis] == world:
            name = _axis_layout(axis, row)
            if name:
                return name
    shown = " x ".join(f"{k} {d}" for k, d in degrees.items() if d > 1) or "one rank"
    raise SpecError(
        "from-plan",
        f"from-plan: check runs a layout over one axis of all {world} "
        f"ranks ({', '.join(LAYOUTS)}); the plan's first row is {shown} under "
        f"{row.get('framework')}",
    )


def _axis_layout(axis: str, row: dict[str, Any]) -> str | None:
    framework = row.get("framework")
    if axis == "fsdp":
        if framework == "handwritten":
            return "fsdp-by-hand"
        if int(row.get("zero", 3)) == 1:
            return "zero1"
        return "fsdp2" if row.get("reshard_after_forward", True) else "fsdp2-noreshard"
    if axis == "tp":
        return "tp-sp" if row.get("sequence_parallel") else "tp"
    if axis == "pp":
        return "pp" if int(row.get("pp_interleave", 1) or 1) == 1 else None
    return {"dp": "ddp", "cp": "cp"}.get(axis)


Case = ClusterCase | ClusterPipeline


def make_case(args: argparse.Namespace, world: int, device: torch.device) -> Case:
    """The case the flags name, checked before any rank joins a group."""
    layout = layout_from_plan(args.from_plan, world) if args.from_plan else args.layout
    gpu = device.type == "cuda"
    batch, seq = args.batch or 2 * world, args.seq or (1024 if gpu else 64)
    precision = args.precision or ("bf16-mixed" if gpu else "fp32")
    if world < 2 and layout != "ddp":  # DDP over one rank is plain one-device training
        raise SpecError("world", f"check needs at least 2 ranks for {layout} (torchrun "
                        "--nproc-per-node ...); one rank runs --layout ddp")  # fmt: skip
    if layout not in ("tp", "tp-sp", "cp") and batch % world:  # shares, or pp's micro-batches
        raise SpecError("batch", f"batch ({batch}) must be a multiple of the {world} ranks")
    if layout == "cp" and seq % (2 * world):
        raise SpecError("seq", f"seq ({seq}) must be a multiple of 2 x {world} under cp")
    if layout == "pp":
        layers = args.layers or max(4, world)
        if layers < world:
            raise SpecError("layers", f"layers ({layers}) must be at least the {world} stages")
        case: Case = ClusterPipeline(world=world, n_layers=layers, micro_batches=world,
                                     batch=batch, seq=seq, precision=precision,
                                     d_model=args.d_model)  # fmt: skip
    else:
        case = ClusterCase(layout=layout, world=world, batch=batch, seq=seq, precision=precision,
                           d_model=args.d_model, n_layers=args.layers)  # fmt: skip
    case.spec()  # a width the model cannot take is refused here, by field
    return case


def _measure(rank: int, world: int, case: Case) -> dict[str, float]:
    if isinstance(case, ClusterPipeline):
        return pipeline.measure(rank, world, case, timed=True)
    return memory.measure(rank, world, case)


def _predicted(case: Case, values: dict[str, Any]) -> list[dict[str, float]]:
    """Each rank's predicted bytes (a pipeline's ranks differ; the others' do not)."""
    if isinstance(case, ClusterPipeline):
        return pipeline.predicted(case)
    return [memory.predicted(case, values)] * case.world


def rows(case: Case, hw: Hardware, results: list[dict[str, float]], device: str) -> list[Row]:
    """Per rank: step seconds and every memory term, predicted against measured."""
    est = estimate(case.spec(), case.train(), case.parallel(), hw)
    layout = "pp" if isinstance(case, ClusterPipeline) else case.layout
    config = {"layout": layout, "world": case.world, "batch": case.batch, "seq": case.seq,
              "precision": case.precision, "hardware": hw.name}  # fmt: skip
    quantities = pipeline.PIPELINE_MEASURED if layout == "pp" else memory.MEASURED
    out = []
    for rank, (r, pred) in enumerate(zip(results, _predicted(case, est.values), strict=True)):
        extra = {"config": config, "rank": rank}
        out.append(Row(SUITE, case.name, "time_s.step.per_rank", float(est["time_s.step"]),
                       r["step_s"], device, "ok", "s", extra))  # fmt: skip
        out += [Row(SUITE, case.name, f"memory_bytes_per_device.{q}", pred[q], r[q], device,
                    "ok", "bytes", extra) for q in quantities]  # fmt: skip
    return out


def report(out: list[Row]) -> str:
    """A table: quantity, rank, predicted, measured, error."""
    lines = [f"{'quantity':<44} {'rank':>4} {'predicted':>12} {'measured':>12} {'error':>8}"]
    for r in out:
        err = rel_err(r.predicted, r.measured)
        shown = f"{err:+.1%}" if err is not None else "n/a"
        lines.append(f"{r.quantity:<44} {r.extra['rank']:>4} {r.predicted:>12.4g} "
                     f"{r.measured:>12.4g} {shown:>8}")  # fmt: skip
    return "\n".join(lines)


def run(args: argparse.Namespace, case: Case, hw: Hardware, device: torch.device) -> None:
    """On every rank: measure, gather; rank 0 writes and prints the comparison."""
    rank, world = dist.get_rank(), dist.get_world_size()
    log, error = None, ""
    if rank == 0:
        try:
            log = ResultsLog(args.out, resume=args.resume)
        except (FileExistsError, OSError) as err:
            error = str(err)
    shared = [error, log is not None and log.is_done(SUITE, case.name)]
    dist.broadcast_object_list(shared, src=0)
    if shared[0]:
        raise SystemExit(f"validate.cluster check: {shared[0]}")
    if shared[1]:
        if rank == 0:
            print(f"{case.name}: already in {args.out} (--resume)", file=sys.stderr)
        return
    start = time.perf_counter()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, _measure(rank, world, case))
    if log is not None:
        out = rows(case, hw, gathered, device.type)
        log.write(out)
        log.finish(SUITE, case.name, "ok", time.perf_counter() - start)
        print(f"{case.name} on {hw.name}:\n{report(out)}")
