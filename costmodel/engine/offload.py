"""Training larger than device memory by streaming from host memory: the feasible plans,
fastest first (``python -m costmodel offload``).

The scheme (ZeRO-Offload, Ren et al. 2021, Sec. 4; ZeRO-Infinity, Rajbhandari et al. 2021,
Sec. 5, with block-wise activation offload): a step runs ``rounds`` rounds, each a forward
and a backward over ``seqs_per_round`` sequences, cut into chunks of ``chunk`` tokens (a
chunk may pack several sequences or hold part of one). Per round and block:

* **weights**: ``pinned_params`` blocks stay on the device; the others are streamed in
  (compute dtype) for forward and again for backward, through two buffers (one computing,
  one loading);
* **gradients**: ``pinned_grads`` blocks accumulate on the device and go to the host once
  per step; the others are sent after each round's backward (two buffers);
* **activations**: a round has L x chunks block-chunk units; ``device_units`` of them stay
  on the device (the last ones forward makes, the first backward needs), the rest go to
  the host saved ``full``, ``attn`` or ``ctx`` (:mod:`costmodel.single.offload`), the
  partial ones re-run part of their block in backward; one unit of workspace, plus a
  prefetch buffer when any unit is on the host.

The optimizer runs on the host CPU (DeepSpeed's CPU-Adam: memory-bound, one fused pass),
with its fp32 master and moments in host memory (``optimizer_state="host"``) or streamed
from NVMe (``"nvme"``, ZeRO-Infinity). Embedding, head and final norm stay on the device;
the head and loss run ``loss_chunk`` tokens at a time (a fused linear-cross-entropy).

Time per phase: max(compute, transfer) + (1 - overlap) x min(...), the transfer being the
busier direction of the full-duplex link; compute comes from :func:`estimate` of one round
on the device (forward, backward), plus re-run FLOPs at forward's achieved rate. Bytes in
B, times in s. The search is exhaustive over pinned parameter blocks and, for unit counts
up to 32, over device units and host save modes; above 32 units those three are searched on
33 evenly spaced counts. Left out: the first block's load before compute starts, reusing the
last forward block's weights at the start of backward, and GEMM efficiency by chunk size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.engine.offload_terms import OffloadConfig, Terms, block_terms
from costmodel.kinds import attention, ffn
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.offload import LINKS, PLAN_KEYS, OffloadSpec

__all__ = ["LINKS", "OffloadConfig", "OffloadSpec", "explain", "plan_offload"]


def chunk_candidates(train: TrainSpec, spec: OffloadSpec) -> list[tuple[int, int]]:
    """(chunk, seqs_per_round) pairs: a round holds whole sequences in whole chunks, and a
    chunk divides a sequence or packs whole ones."""
    T, batch = train.seq, train.batch
    seqs = spec.seqs_per_round or tuple(s for s in range(1, 9) if batch % s == 0)
    for s in seqs:
        checks.divides("seqs_per_round", s, "batch", batch)
    chunks = spec.chunks or tuple(c for c in (T // 4, T // 2, T, 2 * T, 4 * T) if c * 4 >= T)
    pairs = [
        (c, s) for s in seqs for c in chunks if (s * T) % c == 0 and (T % c == 0 or c % T == 0)
    ]
    if not pairs:
        raise SpecError("chunks", f"chunks must divide the sequence or be a multiple of it that "
                        f"divides a round (seq={T}, chunks={chunks})")  # fmt: skip
    return pairs


def _counts(n: int, steps: int = 32) -> np.ndarray:
    """0..n, every integer when n <= steps, else ``steps`` + 1 evenly spaced ones."""
    return np.unique(np.round(np.linspace(0, n, min(n, steps) + 1)).astype(np.int64))


def offloadable(model: ModelSpec, train: TrainSpec) -> None:
    """What offload plans are modelled for: dense models, every weight trained."""
    kinds = [*(kind for kind, _ in ffn.blocks(model)), attention.projections(model)]
    for kind in kinds:  # a block's op sequence is the planned one (dense, standard) or not
        if not kind.offload:
            raise SpecError(kind.field, f"offload plans are not modelled for {kind.title} "
                            f"yet ({kind.field} must be 0)")  # fmt: skip
    if train.finetune != "full":  # its state is per trained parameter, the adapters' apart
        raise SpecError("finetune", "offload plans are modelled for full training "
                        f"(finetune must be full, got {train.finetune})")  # fmt: skip


def plan_offload(
    model: ModelSpec, train: TrainSpec, hw: Hardware, spec: OffloadSpec, *, top: int = 10
) -> list[OffloadConfig]:
    """The ``top`` fastest feasible plans (ties: the one using less memory first)."""
    checks.integer("top", top)
    if spec.device_budget > hw.hbm_bytes:
        raise SpecError("device_budget", f"device_budget must be <= {hw.name}'s memory, "
                        f"{hw.hbm_bytes / 1e9:.6g} GB (got {spec.device_budget / 1e9:.6g} "
                        "GB)")  # fmt: skip
    offloadable(model, train)
    found: list[tuple[float, float, Terms, tuple[int, int, int, int, int]]] = []
    for chunk, seqs in chunk_candidates(train, spec):
        terms = block_terms(model, train, hw, spec, chunk, seqs)
        found += _search(terms, spec, top)
    if not found:
        raise _why_nothing_fits(model, train, hw, spec)
    found.sort(key=lambda f: (round(f[0], 6), f[1]))  # a report for the winners only
    return [t.config(*choice[:4], spec, choice[4]) for _, _, t, choice in found[:top]]


def _why_nothing_fits(
    model: ModelSpec, train: TrainSpec, hw: Hardware, spec: OffloadSpec
) -> SpecError:
    """The budget even the leanest use of it breaks, at the smallest chunk and round: on the
    device, one block in flight with everything else streamed and every unit on the host as
    input + context; on the host, the training state alone (every block kept on the device)."""
    chunk, seqs = min(chunk_candidates(train, spec), key=lambda p: p[0] * p[1])
    t = block_terms(model, train, hw, spec, chunk, seqs)
    device = float(t.evaluate(0, 0, 0, 0, spec, G=0)["device"])
    host = float(t.evaluate(t.layers, t.units, 0, 0, spec, G=t.layers)["host"])
    lean = (("device_budget", device, spec.device_budget, "one block in flight"),
            ("host_budget", host, spec.host_budget, "the training state alone"))  # fmt: skip
    for name, need, have, what in lean:
        if need > have:
            return SpecError(name, f"{name} must be >= {need / 1e9:.2f} GB for {what} "
                             f"(got {have / 1e9:.2f} GB)")  # fmt: skip
    return SpecError("device_budget", "device_budget and host_budget leave no plan together: "
                     "raise either")  # fmt: skip


def _fastest_pinning(t: Terms, choice: tuple, spec: OffloadSpec) -> tuple[Any, Any, Any]:
    """(step, bytes used, pinned gradient blocks) of each choice at its fastest count of
    gradient blocks kept on the device: as many as fit, or a quarter, half, three quarters
    or none of the blocks. Keeping every gradient that fits is not always fastest (the host
    optimizer then waits for them at the step's end instead of receiving them during the
    backward), and one fixed rule made a larger device budget choose a slower plan."""
    steps, used, pinned = [], [], []
    for g in (None, *_counts(t.layers, 4)):  # None: as many as fit
        v = t.evaluate(*choice, spec, G=g)
        steps.append(np.where(v["ok"], v["step"], np.inf))
        used.append(np.broadcast_to(v["used"], steps[-1].shape))
        pinned.append(np.broadcast_to(v["pinned_grads"], steps[-1].shape))
    first = np.argmin(np.stack(steps), axis=0)[None]  # ties: the earlier candidate
    pick = [np.take_along_axis(np.stack(x), first, axis=0)[0] for x in (steps, used, pinned)]
    return pick[0], pick[1], pick[2].astype(np.int64)


def _search(
    t: Terms, spec: OffloadSpec, top: int
) -> list[tuple[float, float, Terms, tuple[int, int, int, int, int]]]:
    """Every (pinned params, device units, full, attn) of one (chunk, round), on a grid, at
    its fastest pinning of gradients (:func:`_fastest_pinning`): the ``4 x top`` fastest as
    (step, bytes used, terms, choice with the pinned gradient blocks)."""
    counts = _counts(t.units)
    # only the unit splits a round has room for (device + full + attn <= units; about a
    # sixth of the cube), in the cube's C order so that ties break as over the whole cube
    a, f, n = np.nonzero(counts[:, None, None] + counts[None, :, None] + counts <= t.units)
    P = np.arange(t.layers + 1)[:, None]
    A, nf, na = counts[a][None, :], counts[f][None, :], counts[n][None, :]
    step, used, pinned = _fastest_pinning(t, (P, A, nf, na), spec)
    grids = [*np.broadcast_arrays(P, A, nf, na), pinned]
    flat, keep = step.ravel(), min(top * 4, step.size)
    # what a stable sort of the whole grid puts first, without sorting the whole grid
    near = np.flatnonzero(flat <= np.partition(flat, keep - 1)[keep - 1])
    out = []
    for i in near[np.argsort(flat[near], kind="stable")][:keep]:
        if not np.isfinite(flat[i]):
            break
        choice = tuple(int(x.flat[i]) for x in grids)
        out.append((float(flat[i]), float(used.flat[i]), t, choice))
    return out


def evaluate_plan(
    model: ModelSpec,
    train: TrainSpec,
    hw: Hardware,
    spec: OffloadSpec,
    decisions: dict[str, int],
) -> OffloadConfig:
    """Memory and time of a plan given as ``chunk``, ``seqs_per_round``, ``pinned_params``,
    ``pinned_grads``, ``device_units``, ``full`` and ``attn`` (host units; the rest ``ctx``),
    e.g. one another tool chose; ``fits`` says which budget it breaks, if any."""
    offloadable(model, train)
    keys = PLAN_KEYS
    for key in keys:
        checks.integer(key, decisions.get(key), minimum=0 if key not in keys[:2] else 1)
    checks.divides("seqs_per_round", decisions["seqs_per_round"], "batch", train.batch)
    t = block_terms(model, train, hw, spec, decisions["chunk"], decisions["seqs_per_round"])
    for key, limit in (("pinned_params", t.layers), ("pinned_grads", t.layers)):
        checks.at_most(key, decisions[key], "n_layers", limit)
    used = decisions["device_units"] + decisions["full"] + decisions["attn"]
    checks.at_most("device_units + full + attn", used, "units per round", t.units,
                   field="device_units")  # fmt: skip
    d = decisions
    return t.config(d["pinned_params"], d["device_units"], d["full"], d["attn"], spec,
                    d["pinned_grads"])  # fmt: skip


def explain(config: OffloadConfig, spec: OffloadSpec) -> list[str]:
    """Why this plan: what bounds each phase and what limits each memory."""
    d, t, h = config.decisions, config.time_s, config.host_units
    lines = [
        f"{d['rounds']} rounds of {d['seqs_per_round']} sequence(s) = {d['tokens_per_round']:,} "
        f"tokens in {d['chunks_per_round']} chunk(s) of {d['chunk']:,} tokens",
    ]
    for phase in ("forward", "backward"):
        comp, h2d, d2h = (t[f"{phase}_{k}"] for k in ("compute", "h2d", "d2h"))
        bound = "compute" if comp >= max(h2d, d2h) else ("host->device" if h2d >= d2h else
                                                         "device->host")  # fmt: skip
        lines.append(f"{phase}: compute {comp:.3f} s, host->device {h2d:.3f} s, device->host "
                     f"{d2h:.3f} s per round: {bound}-bound")  # fmt: skip
    used, total = sum(config.device_bytes.values()), spec.device_budget
    lines.append(f"device {used / 1e9:.2f} of {total / 1e9:.2f} GB: "
                 f"{d['pinned_params']} pinned + buffers = {d['param_slots']} parameter blocks, "
                 f"{d['grad_slots']} gradient blocks, {d['device_units']} activation units "
                 "on the device")  # fmt: skip
    used = sum(config.host_bytes.values())
    lines.append(f"host {used / 1e9:.2f} of {spec.host_budget / 1e9:.2f} GB: "
                 f"{h['full']} units saved full, {h['attn']} input + context + attention, "
                 f"{h['ctx']} input + context")  # fmt: skip
    lines.append(f"optimizer on the host {t['optimizer']:.2f} s and per-step transfers "
                 f"{t['flush']:.2f} s; step {t['step']:.2f} s, "
                 f"{config.tokens_per_s:,.0f} tokens/s")  # fmt: skip
    return lines
