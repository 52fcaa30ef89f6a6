"""Measurements of a training step: phase times, peak memory, per-component op times.

Times: CUDA events around forward, backward and the optimizer step, one synchronize per
step; on CPU ``time.perf_counter`` around the same phases (the phases share state within a
step, so one ``torch.utils.benchmark.Timer`` statement cannot split them; its statistics
are what is reported). Peak memory: ``torch.cuda.max_memory_allocated`` on GPU; on CPU the
live-tensor high-water mark of ``validate.probes.accounting.measure_peaks`` on real tensors.
Per-component times: ``torch.profiler`` with a ``record_function`` range (and an NVTX range
on CUDA, for Nsight Systems) per module; backward ops are attributed to the component
whose forward op has the same autograd sequence number.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PHASES = ("forward", "backward", "optimizer", "step")
_COMPONENTS = (  # module name suffix -> component (first match wins)
    (".attn.q", "attn_qkv"),
    (".attn.k", "attn_qkv"),
    (".attn.v", "attn_qkv"),
    (".attn.o", "attn_o"),
    (".attn.core", "attn_core"),
    (".ffn.w1", "ffn"),
    (".ffn.w2", "ffn"),
    (".ffn.w3", "ffn"),
    ("lm_head", "lm_head"),
)
COMPONENTS = ("attn_qkv", "attn_o", "attn_core", "ffn", "lm_head", "elementwise", "optimizer")
_PREFIX = "costmodel:"
_PHASE_RANGES = ("forward", "backward", "optimizer")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, optimizer, batch) -> tuple[Callable[[], None], ...]:
    """One step's phases as three closures sharing the loss."""
    state: dict[str, torch.Tensor] = {}

    def forward() -> None:
        state["loss"] = model(batch)

    def backward() -> None:
        state.pop("loss").backward()

    def step() -> None:
        if optimizer is not None:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    return forward, backward, step


def time_phases(phases, device: torch.device, steps: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per phase for ``steps`` steps after ``warmup`` (``step``: their sum)."""
    names = ("forward", "backward", "optimizer")
    times: dict[str, list[float]] = {k: [] for k in PHASES}
    for i in range(warmup + steps):
        if device.type == "cuda":
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            marks[0].record()
            for fn, mark in zip(phases, marks[1:], strict=True):
                fn()
                mark.record()
            torch.cuda.synchronize(device)
            spans = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(marks)]
        else:
            spans = []
            for fn in phases:
                start = time.perf_counter()
                fn()
                spans.append(time.perf_counter() - start)
        if i >= warmup:
            for name, span in zip(names, spans, strict=True):
                times[name].append(span)
            times["step"].append(sum(spans))
    return times


def summarize(samples: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(samples),
        "std": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "median": statistics.median(samples),
        "n": len(samples),
    }


def cuda_peaks(model, optimizer, make, device: torch.device) -> dict[str, int]:
    """Peaks keyed as costmodel's, from ``max_memory_allocated`` (the second step's peak)."""
    forward, backward, step = train_step(model, optimizer, make())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    peaks = {}
    forward()
    peaks["peak_forward"] = torch.cuda.max_memory_allocated(device)
    backward()
    peaks["peak_forward_backward"] = torch.cuda.max_memory_allocated(device)
    step()
    forward, backward, step = train_step(model, optimizer, make())
    torch.cuda.reset_peak_memory_stats(device)
    for fn in (forward, backward, step):
        fn()
    peaks["peak"] = torch.cuda.max_memory_allocated(device)
    return peaks


def _install_ranges(model: torch.nn.Module, cuda: bool) -> list:
    handles = []
    for name, module in model.named_modules():
        comp = next((c for suffix, c in _COMPONENTS if f".{name}".endswith(suffix)), None)
        if comp is None:
            continue

        def enter(mod, args, comp=comp):
            mod._costmodel_range = record_function(_PREFIX + comp)
            mod._costmodel_range.__enter__()
            if cuda:
                torch.cuda.nvtx.range_push(comp)

        def leave(mod, args, out):
            if cuda:
                torch.cuda.nvtx.range_pop()
            mod._costmodel_range.__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


def _component_of(event) -> str | None:
    parent = event
    while parent is not None:
        if parent.name.startswith(_PREFIX):
            name = parent.name[len(_PREFIX) :]
            return None if name in _PHASE_RANGES else name
        parent = parent.cpu_parent
    return None


def _profiled_events(model, phases, device: torch.device):
    """Run one step's phases under torch.profiler with a range per phase and component."""
    cuda = device.type == "cuda"
    handles = _install_ranges(model, cuda)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with profile(activities=activities) as prof:
            for name, fn in zip(_PHASE_RANGES, phases, strict=True):
                with record_function(_PREFIX + name):
                    if cuda:
                        torch.cuda.nvtx.range_push(name)
                    fn()
                    _sync(device)
                    if cuda:
                        torch.cuda.nvtx.range_pop()
    finally:
        for h in handles:
            h.remove()
    return prof.events()


def profile_components(model, phases, device: torch.device) -> dict[str, dict[str, float]]:
    """Seconds per component in forward and backward, and of the optimizer, one step.

    ``elementwise`` is the rest of each pass (norms, activations, rotary, residuals,
    embedding, loss): in forward the pass total minus the matmul components; in backward
    every autograd node whose forward op ran outside a component's range.
    """
    cuda = device.type == "cuda"
    events = _profiled_events(model, phases, device)

    def seconds(e) -> float:
        return (e.device_time_total if cuda else e.cpu_time_total) / 1e6

    forward: dict[str, float] = defaultdict(float)
    backward: dict[str, float] = defaultdict(float)
    totals, seq_comp = {}, {}
    for e in events:
        name = e.name[len(_PREFIX) :] if e.name.startswith(_PREFIX) else None
        if name in _PHASE_RANGES:
            totals[name] = seconds(e)
        elif name is not None:
            forward[name] += seconds(e)
        elif e.sequence_nr >= 0 and not e.name.startswith("autograd::engine"):
            comp = _component_of(e)
            if comp is not None:
                seq_comp.setdefault(e.sequence_nr, comp)
    for e in events:
        if e.name.startswith("autograd::engine::evaluate_function"):
            backward[seq_comp.get(e.sequence_nr, "elementwise")] += seconds(e)
    forward["elementwise"] = totals["forward"] - sum(forward.values())
    backward.setdefault("elementwise", 0.0)
    return {"forward": dict(forward), "backward": dict(backward),
            "optimizer": {"optimizer": totals.get("optimizer", 0.0)}}  # fmt: skip
