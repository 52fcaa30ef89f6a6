"""The nearest change that serves the batch a serving question asks where it does not fit
(``costmodel.answers.serve.answer``'s ``nearest``): the flags of the CLI, the same search
for the API and the app."""

from __future__ import annotations

from dataclasses import replace

from costmodel.serving.estimate import ServeEstimate, serve
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import ServeSpec


def nearest_fit(model: ModelSpec, spec: ServeSpec, hw: Hardware, est: ServeEstimate) -> str:
    """The first change that fits the user's batch, in this order: a disaggregated
    deployment's larger prefill tp, a mixture-of-experts model's experts over every device
    of its replicas (ep), an fp8 cache, fp8 weights, more tp within a node (each
    doubling), more tp with an fp8 cache, then both fp8 at the largest tp; else the change
    that holds the most of it, the largest batch that fits as asked, or that nothing fits
    on one node."""
    want, partial, most = _wanted(spec), None, 0
    for change, flags in _changes(model, spec, hw):
        try:
            got = serve(model, change, hw)
        except SpecError:
            continue
        if got["fits"] and got["max_batch"] >= want:
            return f"{flags} {_holds(spec, want)}"
        if got["max_batch"] > most:  # else the change that holds the most of the batch
            most = got["max_batch"]
            partial = f"{flags} fits {most:,} at once (of the {want:,} asked)"
    if partial is not None:
        return partial
    if est["max_batch"] >= 1:
        return f"--batch {est['max_batch']:,} fits as asked"
    return (f"no batch fits on one node of {hw.name} with tp, fp8 weights and an fp8 cache: "
            "serve with pp or a larger device")  # fmt: skip


def _wanted(spec: ServeSpec) -> int:
    """Sequences a replica should hold at once: a static batch whole, a closed loop's users
    (up to the engine's cap), one for an open loop (its queue is the rate's)."""
    if spec.concurrency:
        return min(spec.batch, -(-spec.concurrency // spec.dp))
    return spec.batch if spec.arrival == "together" else 1


def _holds(spec: ServeSpec, want: int) -> str:
    if spec.concurrency:
        return f"holds the {want:,} users a replica at once"
    return f"fits the batch of {want:,}" if spec.arrival == "together" else "fits"


def _changes(model: ModelSpec, spec: ServeSpec, hw: Hardware) -> list[tuple[ServeSpec, str]]:
    fp8 = bool(hw.peak_flops.get("fp8"))
    fp8_cache = fp8 or hw.kind == "gpu"  # stored and converted in the kernel (specs.serving)
    out = []
    degree = spec.prefill_degree * 2
    while spec.prefill_replicas and degree <= hw.devices_per_node:  # the prefill pool's own
        out.append((replace(spec, prefill_tp=degree), f"--prefill-tp {degree}"))
        degree *= 2
    devices = spec.tp * spec.dp
    if model.n_experts and spec.dp > 1 and spec.ep < devices:  # experts over every device
        out.append((replace(spec, ep=devices), f"--ep {devices}"))
    if fp8_cache and spec.kv_dtype != "fp8":
        out.append((replace(spec, kv_dtype="fp8"), "--kv-dtype fp8"))
    if fp8 and spec.precision != "fp8":
        out.append((replace(spec, precision="fp8"), "--precision fp8"))
    tp = spec.tp * 2
    while tp <= hw.devices_per_node:  # a tp the heads refuse is skipped (a SpecError)
        out.append(_more_tp(spec, tp))
        tp *= 2
    top = tp // 2
    tp = spec.tp * 2
    while fp8_cache and spec.kv_dtype != "fp8" and tp <= top:  # more tp, the cache alone fp8
        out.append(_more_tp(spec, tp, kv_dtype="fp8"))
        tp *= 2
    if fp8 and top > spec.tp:
        out.append(_more_tp(spec, top, precision="fp8", kv_dtype="fp8"))
    return out


def _more_tp(spec: ServeSpec, tp: int, **more: str) -> tuple[ServeSpec, str]:
    """``spec`` at a larger ``tp`` on the same devices where its replicas allow (fewer
    replicas: dp halves as tp doubles), else with more devices, and the flags that say so
    whether the user gave ``--gpus`` or ``--dp`` (``--gpus`` is checked against tp x pp x
    dp: a tp alone would not fit the devices given)."""
    devices = spec.tp * spec.dp
    dp = devices // tp if devices % tp == 0 else spec.dp
    changed = replace(spec, tp=tp, dp=dp, **more)
    flags = [f"--tp {tp}", *(f"--dp {dp}" for _ in range(dp != spec.dp))]
    if tp * dp != devices and not spec.prefill_replicas:  # more devices than before
        flags.append(f"--gpus {tp * spec.pp * dp}")
    flags += [f"--{k.replace('_', '-')} {v}" for k, v in more.items()]
    return changed, " ".join(flags)
