"""The model suite: time and peak memory of real training steps against costmodel.

Each case builds the reference model for a preset (optionally with fewer layers, so it
runs on the device), times forward, backward and the optimizer step over several steps
after warm-up, measures the three memory peaks, and writes predicted vs measured rows
for each, plus achieved TFLOP/s and MFU (useful causal FLOPs over the measured step, as
training dashboards report them, against the profile's peak). Profiled cases add the
per-component breakdown of ``validate.probes.measure.profile_components`` against costmodel's
per-op roofline times.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from costmodel import estimate, get_model
from costmodel.engine.estimate import Estimate
from costmodel.single.precision import PRECISIONS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from validate.probes.accounting import make_optimizer, measure_peaks
from validate.probes.measure import (
    COMPONENTS,
    cuda_peaks,
    profile_components,
    summarize,
    time_phases,
    train_step,
)
from validate.reference.model import TransformerLM, make_batch
from validate.report.results import Row
from validate.suites.runner import Case, Context, free_bytes

SUITE = "model"
PEAKS = ("peak_forward", "peak_forward_backward", "peak")


@dataclass(frozen=True)
class ModelCase:
    preset: str
    layers: int | None
    batch: int
    seq: int
    precision: str = "fp32"
    attention: str = "flash"
    compiled: bool = False
    optimizer_impl: str = "foreach"
    profile: bool = False

    @property
    def name(self) -> str:
        depth = f"@L{self.layers}" if self.layers else ""
        mode = "compiled" if self.compiled else "eager"
        return (
            f"{self.preset}{depth}/b{self.batch}/t{self.seq}/{self.precision}/"
            f"{self.attention}/{mode}/adamw-{self.optimizer_impl}"
        )

    def spec(self) -> ModelSpec:
        spec = get_model(self.preset)
        return spec.replace(n_layers=self.layers) if self.layers else spec

    def train(self) -> TrainSpec:
        return TrainSpec(
            batch=self.batch,
            seq=self.seq,
            precision=self.precision,
            attention=self.attention,
            elementwise="fused" if self.compiled else "eager",
            optimizer="adamw",
            optimizer_impl=self.optimizer_impl,
        )


def fast_cpu_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (oneDNN's AVX512-BF16 or AMX path)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def grid(device: torch.device, quick: bool) -> list[ModelCase]:
    """Configurations that fit the device: a GPT-2 and a Llama-style family; ``quick`` on a
    CPU times one shape of each, fp32 only without native bf16, and leaves the compiled
    variant to the full grid."""
    if device.type == "cuda":
        models = [("gpt2", None), ("cs336-large", None), ("llama3-8b", 4)]
        shapes = [(8, 1024), (4, 2048)] if quick else [(8, 512), (8, 1024), (4, 2048), (16, 1024)]
        precisions = ("bf16-mixed",) if quick else ("bf16-mixed", "fp32")
    else:  # quick: one shape of each family (the full grid varies batch and length)
        models = [("gpt2", 2), ("cs336-small", 2)] if quick else [("gpt2", 4), ("cs336-small", 12)]
        shapes = [(1, 256)] if quick else [(1, 256), (2, 512), (4, 256), (1, 1024)]
        # without native bf16 (AVX512-BF16/AMX) a bf16 matmul is emulated, ~300x slower
        # than fp32 (0.28 vs 94 GFLOP/s on an AVX2 VM): one case took 8 minutes
        precisions = ("fp32", "bf16-mixed") if not quick or fast_cpu_bf16() else ("fp32",)
    cases = []
    for (preset, layers), (b, t), prec in itertools.product(models, shapes, precisions):
        spec = get_model(preset)
        if spec.pos == "learned" and t > spec.max_positions:  # GPT-2's stop at 1,024
            continue
        for attention in ("flash", "naive"):
            cases.append(ModelCase(preset, layers, b, t, prec, attention))
    first = cases[0]
    variants = [
        ModelCase(**{**first.__dict__, "optimizer_impl": "fused"}),
        ModelCase(**{**first.__dict__, "profile": True, "optimizer_impl": "fused"}),
    ]
    if not quick or device.type == "cuda":  # inductor's compile: 40 s of a 2-core CPU
        variants.insert(1, ModelCase(**{**first.__dict__, "compiled": True}))
    if not quick:
        variants += [ModelCase(**{**c.__dict__, "compiled": True}) for c in cases[1:4]]
    return cases + variants


def cases(ctx: Context) -> list[Case]:
    out = []
    for mc in grid(ctx.device, ctx.quick):
        name = mc.name + ("/profile" if mc.profile else "")
        out.append(Case(SUITE, name, lambda ctx, mc=mc, name=name: run(mc, name, ctx)))
    return out


def run(mc: ModelCase, name: str, ctx: Context) -> Iterator[Row]:
    spec, train = mc.spec(), mc.train()
    est = estimate(spec, train, ParallelSpec(), ctx.hardware)
    config = {k: v for k, v in mc.__dict__.items() if k != "profile"}

    def row(quantity, predicted, measured, unit, status="ok", **extra) -> Row:
        extra = {"config": config, **extra}
        return Row(SUITE, name, quantity, predicted, measured, ctx.label, status, unit, extra)

    need = est["memory_bytes.peak"]
    if ctx.device.type == "cpu" and need > 0.8 * free_bytes(ctx.device):
        yield row("memory_bytes.peak", need, None, "bytes", "skipped", message="would not fit")
        return
    steps, warmup = (3, 1) if ctx.quick else (5, 2)
    if mc.compiled:
        warmup += 1  # the first steps compile forward and backward
    if mc.profile:
        yield from _profile_rows(mc, spec, train, est, ctx, row)
        return
    yield from _time_rows(mc, spec, train, est, ctx, row, steps, warmup)
    if not mc.compiled or ctx.device.type == "cuda":  # inductor's buffers are not tensors
        yield from _memory_rows(spec, train, est, ctx, row, mc.compiled)


def _build(spec, train, ctx, compiled: bool):
    torch.manual_seed(0)
    model = TransformerLM.for_training(spec, train, ctx.device)
    optimizer = make_optimizer(model.parameters(), train)
    runner = torch.compile(model) if compiled else model
    return model, runner, optimizer


def _time_rows(mc, spec, train, est: Estimate, ctx, row, steps, warmup) -> Iterator[Row]:
    model, runner, optimizer = _build(spec, train, ctx, mc.compiled)
    batch = make_batch(model, train.micro_batch, train.seq, device=ctx.device)
    times = time_phases(train_step(runner, optimizer, batch), ctx.device, steps, warmup)
    stats = {phase: summarize(samples) for phase, samples in times.items()}
    for phase, s in stats.items():
        yield row(f"time_s.{phase}", est[f"time_s.{phase}"], s["mean"], "s", std=s["std"], n=s["n"])
    useful = est["flops.conventions.useful"]
    peak = ctx.hardware.peak(PRECISIONS[train.precision].peak_dtype)
    step = stats["step"]["mean"]
    yield row("tflops_per_device", est["tflops_per_device"], useful / step / 1e12, "TFLOP/s")
    yield row("mfu", est["mfu"], useful / step / peak, "fraction")


def _memory_rows(spec, train, est: Estimate, ctx, row, compiled: bool) -> Iterator[Row]:
    if ctx.device.type == "cuda":
        model, runner, optimizer = _build(spec, train, ctx, compiled)

        def make():
            return make_batch(model, train.micro_batch, train.seq, device=ctx.device)

        peaks = cuda_peaks(runner, optimizer, make, ctx.device)
        del model, runner, optimizer
    else:
        peaks = measure_peaks(spec, train, ctx.device)
    for key in PEAKS:
        yield row(f"memory_bytes.{key}", est[f"memory_bytes.{key}"], peaks[key], "bytes")


def predicted_components(spec: ModelSpec, est: Estimate) -> dict:
    """costmodel's seconds per component, forward and backward (per-op roofline times)."""

    def components(quantity: str) -> dict[str, float]:
        ops = {}
        for op in ("attn_q", "attn_k", "attn_v", "attn_o", "attn_core", "ffn", "lm_head"):
            key, times = f"roofline.{op}.{quantity}", 1 if op == "lm_head" else spec.n_layers
            ops[op] = est[key] * times if key in est.values else 0.0
        return {
            "attn_qkv": ops["attn_q"] + ops["attn_k"] + ops["attn_v"],
            "attn_o": ops["attn_o"],
            "attn_core": ops["attn_core"],
            "ffn": ops["ffn"],
            "lm_head": ops["lm_head"],
        }

    fwd, bwd = components("time_s"), components("backward_s")
    fwd["elementwise"] = est["time_s.forward"] - sum(fwd.values())
    bwd["elementwise"] = est["time_s.backward"] - sum(bwd.values())
    return {"forward": fwd, "backward": bwd, "optimizer": {"optimizer": est["time_s.optimizer"]}}


def _profile_rows(mc, spec, train, est: Estimate, ctx, row) -> Iterator[Row]:
    model, runner, optimizer = _build(spec, train, ctx, mc.compiled)
    batch = make_batch(model, train.micro_batch, train.seq, device=ctx.device)
    phases = train_step(runner, optimizer, batch)
    time_phases(phases, ctx.device, steps=1, warmup=1)
    measured = profile_components(model, phases, ctx.device)
    predicted = predicted_components(spec, est)
    for phase, parts in predicted.items():
        for comp in COMPONENTS:
            if comp in parts:
                got = measured[phase].get(comp, 0.0)
                yield row(f"op_time_s.{phase}.{comp}", parts[comp], got, "s")
