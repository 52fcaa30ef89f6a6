"""The distributed suites: collectives (and the α-β fit), DDP variants, FSDP and TP.

Each case runs on ranks of its own (``validate.distributed.launch.launch``: gloo on CPU, NCCL
on GPUs), with a bounded timeout: under ``validate.run`` the timing cases share ranks kept for
the run (``validate.distributed.pool``), the memory cases start new ones. ``collectives``
fits α and β over every op, size and world size and writes them into the run's hardware
profile, which the later ``ddp`` and ``parallel`` cases read for their time predictions.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import torch

from costmodel import ParallelSpec, estimate
from costmodel.catalog.hardware import get_hardware
from costmodel.parallel.collectives import DDP_VARIANTS, collective_time, ddp_allreduce_time
from costmodel.parallel.layout import group_links
from costmodel.single.precision import optimizer_state_bytes
from costmodel.specs.hardware import Hardware
from validate.distributed import collectives as coll
from validate.distributed import pipeline
from validate.distributed.checks import (
    FROZEN_PARAMS,
    ddp_params,
    parallel_spec,
    spec_and_train,
    step,
    time_variant,
)
from validate.distributed.launch import backend_for, launch, rank_hardware
from validate.distributed.memory import LAYOUTS, MEASURED, SENDS, LayoutCase, predicted
from validate.distributed.memory import measure as measure_layout
from validate.distributed.pipeline import PipelineCase
from validate.report.results import Row
from validate.suites.runner import Case, Context

TIMEOUT_S = 600


def _worlds(ctx: Context) -> list[int]:
    if ctx.device.type == "cuda":
        n = torch.cuda.device_count()
        return [w for w in (2, 4, 8) if w <= n] or [1]
    cores = os.cpu_count() or 1
    return [2] if ctx.quick else [w for w in (2, 4, 6) if w <= max(2, 2 * cores)]


def _hardware(ctx: Context) -> Hardware:
    """The profile as it is now (with the collectives fit when that case has run)."""
    if ctx.profile_path is not None and ctx.profile_path.exists():
        return get_hardware(str(ctx.profile_path))
    return ctx.hardware


def collectives_case(ctx: Context) -> Iterator[Row]:
    backend = backend_for(ctx.device.type)
    # 1 MiB to 32 MiB (quick) or 1 GiB, plus small messages (4 KiB to 256 KiB): without
    # latency-bound sizes the fit cannot tell α apart from noise
    top = 25 if ctx.quick else 30
    sizes = [2**k for k in range(12, 20, 2)] + [2**k for k in range(20, top + 1)]
    reps = 5 if ctx.quick else 7
    rows = []
    for world in _worlds(ctx):
        if world < 2:
            continue
        per_rank = launch(coll.bench, world, sizes, reps, backend=backend, timeout_s=TIMEOUT_S)
        rows += coll.aggregate(per_rank, world)
    # one (α, β) per collective: gloo's algorithms differ (its reduce-scatter moves bytes at
    # a fraction of its all-reduce's rate); the profile takes the all-reduce's, the
    # collective data and tensor parallelism run most
    fits = {op: coll.fit_alpha_beta([r for r in rows if r["op"] == op]) for op in coll.OPS}
    if ctx.profile_path is not None:
        coll.write_link_profile(ctx.profile_path, *fits["all_reduce"], backend)
    for r in rows:
        alpha, beta = fits[r["op"]]
        predicted = collective_time(r["op"], r["size_bytes"], r["world"], alpha, beta)
        extra = {
            "config": {k: r[k] for k in ("op", "size_bytes", "world")},
            "busbw": r["busbw"],
            "algbw": r["algbw"],
            "alpha_s": alpha,
            "beta_Bps": beta,
            "backend": backend,
        }
        yield Row(
            "collectives",
            backend,
            f"time_s.{r['op']}",
            predicted,
            r["seconds"],
            ctx.label,
            "ok",
            "s",
            extra,
        )


def _predicted_comm(
    variant: str, grad_sizes: list[int], world: int, hw: Hardware, bucket_mb: float
) -> float:
    """costmodel's α-β seconds for a variant's all-reduces, on the link costmodel places a
    dp group of this size on; the launcher's ranks share one machine (one node)."""
    one_node = dataclasses.replace(hw, devices_per_node=max(world, hw.devices_per_node))
    beta, alpha = group_links(ParallelSpec(dp=world), one_node)["dp"]
    return ddp_allreduce_time(variant, grad_sizes, world, alpha, beta, bucket_mb)


def ddp_case(variant: str, bucket_mb: float, ctx: Context) -> Iterator[Row]:
    world, hw = 2, _hardware(ctx)
    dim, steps = (256, 5) if ctx.quick else (512, 10)
    results = launch(
        time_variant,
        world,
        variant,
        steps,
        dim,
        bucket_mb,
        backend=backend_for(ctx.device.type),
        timeout_s=TIMEOUT_S,
    )
    step_s = max(r["step_s"] for r in results)
    sync_s = max(r["sync_s"] for r in results)
    sizes = results[0]["grad_sizes"]
    comm = _predicted_comm(variant, sizes, world, hw, bucket_mb)
    config = {"variant": variant, "bucket_mb": bucket_mb, "world": world, "dim": dim}
    name = f"{variant}" + (f"/bucket{bucket_mb}MB" if variant == "bucketed" else "")
    blocking = variant in ("naive", "flat")
    yield Row("ddp", name, "time_s.step", None, step_s, ctx.label, "ok", "s", {"config": config})
    # naive and flat block on all their communication: what finish() waits is all of it;
    # the overlapped variants wait only for what backward did not hide
    quantity = "comm_time_s" if blocking else "comm_time_s.exposed"
    yield Row(
        "ddp",
        name,
        quantity,
        comm if blocking else None,
        sync_s,
        ctx.label,
        "ok",
        "s",
        {"config": config, "predicted_total_comm_s": comm, "comm_share": sync_s / step_s},
    )


def zero1_case(ctx: Context) -> Iterator[Row]:
    """Per-rank optimizer state of ShardedOptimizer against costmodel's ZeRO-1 shard."""
    world = 2
    results = launch(
        ddp_params,
        world,
        "flat",
        2,
        True,
        backend=backend_for(ctx.device.type),
        timeout_s=TIMEOUT_S,
    )
    trainable = sum(p.numel() for p in results[0]["params"]) - FROZEN_PARAMS
    # ZeRO-1 shards the optimizer state over the world (parallel.distributed.sharded_state)
    predicted = optimizer_state_bytes("adamw", "fp32", trainable) / world
    for rank, r in enumerate(results):
        yield Row(
            "ddp",
            "zero1",
            "memory_bytes.optimizer",
            predicted,
            r["state_bytes"],
            ctx.label,
            "ok",
            "bytes",
            {"config": {"world": world}, "rank": rank},
        )
    # whole parameters per rank make the shards uneven; their sum is the whole state
    total = sum(r["state_bytes"] for r in results)
    yield Row(
        "ddp",
        "zero1",
        "memory_bytes.optimizer.all_ranks",
        predicted * world,
        total,
        ctx.label,
        "ok",
        "bytes",
        {"config": {"world": world}},
    )


def parallel_case(kind: str, ctx: Context) -> Iterator[Row]:
    world, batch, seq, precision = 2, 4, 64, "fp32"
    results = launch(
        step,
        world,
        kind,
        batch,
        seq,
        precision,
        backend=backend_for(ctx.device.type),
        timeout_s=TIMEOUT_S,
    )
    spec, train = spec_and_train(batch, seq, precision)
    par = parallel_spec(kind, world)
    est = estimate(spec, train, par, _hardware(ctx))
    group = kind.split("-")[0]
    config = {"kind": kind, "world": world, "batch": batch, "seq": seq, "precision": precision}
    for rank, r in enumerate(results):
        extra = {"config": config, "rank": rank, "calls": r["calls"], "sizes": r["sizes"]}
        yield Row(
            "parallel",
            f"{kind}/world{world}",
            f"comm_bytes.{group}",
            est[f"comm_bytes.{group}"],
            r["ring_bytes"],
            ctx.label,
            "ok",
            "bytes",
            extra,
        )
    # the ranks' own time inside their counted collectives (validate.probes.comm_count),
    # the slowest rank's sum: what the α-β model predicts, and never negative
    per_rank = [r["comm_s"] for r in results]
    measured_as = (
        "max over ranks of the sum of perf_counter spans around each counted collective, "
        "waited to completion (CUDA synchronized before and after)"
    )
    yield Row(
        "parallel",
        f"{kind}/world{world}",
        f"comm_time_s.{group}",
        est[f"comm_time_s.{group}"],
        max(per_rank),
        ctx.label,
        "ok",
        "s",
        {"config": config, "measured_as": measured_as, "per_rank_comm_s": per_rank},
    )


def layout_case(case: LayoutCase, ctx: Context) -> Iterator[Row]:
    """Per rank: bytes held (``memory_bytes_per_device.*``) and step seconds against
    costmodel's per-device prediction for the same layout and framework; the state bytes
    also summed over the ranks (``.all_ranks``: exact even where whole-parameter ZeRO-1
    shards differ by a few hundred bytes between ranks)."""
    results = launch(
        measure_layout,
        case.world,
        case,
        backend=backend_for(ctx.device.type),
        timeout_s=TIMEOUT_S,
        fresh=True,  # memory peaks as a new training process has them
    )
    hw = rank_hardware(_hardware(ctx), case.world)
    est = estimate(case.spec(), case.train(), case.parallel(), hw)
    pred = predicted(case, est.values)
    config = {"layout": case.layout, "world": case.world, "batch": case.batch,
              "seq": case.seq, "precision": case.precision}  # fmt: skip
    for rank, r in enumerate(results):
        extra = {"config": config, "rank": rank}
        for q in MEASURED:
            yield Row("parallel", case.name, f"memory_bytes_per_device.{q}", pred[q], r[q],
                      ctx.label, "ok", "bytes", extra)  # fmt: skip
        yield Row("parallel", case.name, "time_s.step.per_rank", est["time_s.step"],
                  r["step_s"], ctx.label, "ok", "s", extra)  # fmt: skip
    if case.layout in SENDS:  # the ring's or the all-to-alls' sends, counted as they go
        key = f"comm_bytes.{case.layout}"
        for rank, r in enumerate(results):
            extra = {"config": config, "rank": rank}
            yield Row("parallel", case.name, key, est[key], r["sent_bytes"], ctx.label, "ok",
                      "bytes", extra)  # fmt: skip
    for q in ("params", "grads", "optimizer"):
        yield Row("parallel", case.name, f"memory_bytes_per_device.{q}.all_ranks",
                  pred[q] * case.world, sum(r[q] for r in results), ctx.label, "ok", "bytes",
                  {"config": config})  # fmt: skip


def pipeline_case(case: PipelineCase, ctx: Context) -> Iterator[Row]:
    """Per rank: state, the schedule's receive buffers and the peaks under
    torch.distributed.pipelining against costmodel's prediction for that rank
    (``rank_memory``: each rank holds its own layers and micro-batches in flight)."""
    results = launch(pipeline.measure, case.world, case, backend=backend_for(ctx.device.type),
                     timeout_s=TIMEOUT_S, fresh=True)  # fmt: skip
    config = {"layout": case.schedule, "world": case.world, "virtual": case.virtual,
              "n_layers": case.n_layers, "micro_batches": case.micro_batches,
              "batch": case.batch, "seq": case.seq, "precision": case.precision}  # fmt: skip
    for rank, (r, pred) in enumerate(zip(results, pipeline.predicted(case), strict=True)):
        for q in pipeline.PIPELINE_MEASURED:
            yield Row("parallel", case.name, f"memory_bytes_per_device.{q}", pred[q], r[q],
                      ctx.label, "ok", "bytes", {"config": config, "rank": rank})  # fmt: skip


def pipeline_cases(ctx: Context) -> list[PipelineCase]:
    """1F1B on 2 ranks (fp32; with --quick only this), in bf16 mixed precision, with an
    uneven split and interleaved; on 4 ranks where the machine allows."""
    if ctx.quick:
        return [PipelineCase()]
    cases = [PipelineCase(), PipelineCase(precision="bf16-mixed"), PipelineCase(n_layers=5),
             PipelineCase(schedule="interleaved", virtual=2)]  # fmt: skip
    if max(_worlds(ctx)) >= 4:
        cases.append(PipelineCase(world=4))
    return cases


def layout_cases(ctx: Context) -> list[LayoutCase]:
    """Every layout in fp32 and bf16 mixed precision on 2 ranks; FSDP2 also on 4 and with a
    mixture-of-experts model; expert parallelism of that model (also with --quick). With
    --quick bf16 mixed precision only, where state and compute dtypes differ
    (tests/test_rank_memory.py runs them all)."""
    precisions = ("bf16-mixed",) if ctx.quick else ("fp32", "bf16-mixed")
    cases = [LayoutCase(lay, precision=p) for lay in LAYOUTS for p in precisions]
    cases.append(LayoutCase("ep", experts=4))  # expert parallelism: all-to-all bytes
    if not ctx.quick:
        cases += [LayoutCase("fsdp2", experts=4), LayoutCase("ep-fsdp2", experts=4)]
    if not ctx.quick and max(_worlds(ctx)) >= 4:
        cases.append(LayoutCase("fsdp2", world=4, batch=8))
    return cases


def collectives_cases(ctx: Context) -> list[Case]:
    return [Case("collectives", backend_for(ctx.device.type), collectives_case)]


def ddp_cases(ctx: Context) -> list[Case]:
    cases = [
        Case("ddp", v, lambda c, v=v: ddp_case(v, 0.25, c)) for v in DDP_VARIANTS if v != "bucketed"
    ]
    sweep = (0.01, 4.0) if ctx.quick else (0.01, 0.05, 0.25, 1.0, 4.0, 25.0)
    cases += [
        Case("ddp", f"bucketed/bucket{mb}MB", lambda c, mb=mb: ddp_case("bucketed", mb, c))
        for mb in sweep
    ]
    cases.append(Case("ddp", "zero1", zero1_case))
    return cases


def parallel_cases(ctx: Context) -> list[Case]:
    kinds = ("fsdp", "fsdp-by-hand", "tp", "tp-sp")
    cases = [Case("parallel", f"{k}/world2", lambda c, k=k: parallel_case(k, c)) for k in kinds]
    cases += [
        Case("parallel", lc.name, lambda c, lc=lc: layout_case(lc, c)) for lc in layout_cases(ctx)
    ]
    return cases + [
        Case("parallel", pc.name, lambda c, pc=pc: pipeline_case(pc, c))
        for pc in pipeline_cases(ctx)
    ]
