"""The numbers of one (chunk, round) of an offload plan, and memory and time of every choice.

The scheme and its sources are in :mod:`costmodel.engine.offload`; this module turns the
specs into bytes per block and per unit (:mod:`costmodel.single.offload`,
:func:`costmodel.single.memory.state_memory`'s bytes per parameter) and seconds per round
(:func:`costmodel.engine.estimate.estimate` of one round on the device), then evaluates
memory and time for arrays of decisions (``Terms.evaluate``), so the search and the report
of the chosen plan use one formula.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.engine.estimate import estimate
from costmodel.single.memory import transient_bytes
from costmodel.single.offload import SAVE_MODES, recompute_flops_per_token, saved_bytes_per_token
from costmodel.single.params import block_params, param_breakdown
from costmodel.single.precision import PRECISIONS, optimizer_state_bytes, optimizer_traffic
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.offload import OffloadSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import K, d_h, smax, values_for


@dataclass(frozen=True)
class OffloadConfig:
    """One feasible plan: its decisions, memory by component and time by phase."""

    decisions: dict[str, int]
    host_units: dict[str, int]
    device_bytes: dict[str, float]
    host_bytes: dict[str, float]
    time_s: dict[str, float]
    tokens_per_s: float
    fits: dict[str, bool]

    def to_dict(self) -> dict[str, Any]:
        return {"decisions": self.decisions, "host_units": self.host_units,
                "device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
                "time_s": self.time_s, "tokens_per_s": self.tokens_per_s,
                "fits": self.fits}  # fmt: skip


@dataclass(frozen=True)
class Terms:
    """Bytes and seconds of one (chunk, sequences per round) choice."""

    chunk: int
    seq: int
    seqs: int
    rounds: int
    layers: int
    units: int
    param_block: float
    grad_block: float
    unit: dict[str, float]
    recompute_s: dict[str, float]
    forward_s: float
    backward_s: float
    optimizer_s: float
    device_fixed: dict[str, float]
    host_fixed: dict[str, float]
    stream_copies: bool
    nonblock_link: float

    def evaluate(
        self, P: Any, A: Any, nf: Any, na: Any, spec: OffloadSpec, G: Any = None
    ) -> dict[str, Any]:
        """Memory and time of pinned params P, device units A, nf full and na attn host
        units (the rest ctx) and G pinned gradient blocks (None: as many as fit)."""
        L, U = self.layers, self.units
        nc = U - A - nf - na
        out: dict[str, Any] = {"ctx": nc}
        out["param_blocks"] = (P + 2 * (P < L)) * self.param_block
        out["activation_units"] = A * self.unit["full"]
        # the block in flight (materialised), and the next host unit's restore in flight
        prefetch = np.where(nf > 0, self.unit["full"], np.where(na > 0, self.unit["attn"],
                            np.where(nc > 0, self.unit["ctx"], 0.0)))  # fmt: skip
        out["activation_workspace"] = self.unit["full"] + prefetch
        dev = sum(self.device_fixed.values()) + out["param_blocks"] + out["activation_units"]
        room = np.floor((spec.device_budget - dev - out["activation_workspace"]) / self.grad_block)
        fits = np.where(room >= L, L, room - 2)
        G = fits if G is None else G
        out["pinned_grads"] = G
        out["grad_blocks"] = np.minimum(np.maximum(G + 2, 0), L) * self.grad_block
        out["streamed_weights"] = (L - P) * self.param_block * self.stream_copies
        out["activations"] = nf * self.unit["full"] + na * self.unit["attn"] + nc * self.unit["ctx"]
        host = sum(self.host_fixed.values()) + out["streamed_weights"] + out["activations"]
        out["device_ok"] = (G >= 0) & (fits >= G)
        out["host_ok"] = host <= spec.host_budget
        out["ok"] = (nc >= 0) & out["device_ok"] & out["host_ok"]
        out["device"] = dev + out["activation_workspace"] + out["grad_blocks"]
        out["host"] = host
        out["used"] = out["device"] + host
        self._times(out, P, G, na, nc, spec)
        return out

    def _times(self, out: dict, P: Any, G: Any, na: Any, nc: Any, spec: OffloadSpec) -> None:
        streamed, acts = (self.layers - P) * self.param_block, out["activations"]
        redo = na * self.recompute_s["attn"] + nc * self.recompute_s["ctx"]
        phases = {
            "forward": (self.forward_s, streamed, acts),
            "backward": (
                self.backward_s + redo,
                streamed + acts,
                (self.layers - G) * self.grad_block,
            ),
        }
        for name, (compute, h2d, d2h) in phases.items():
            h2d_s, d2h_s = h2d / spec.link_bw, d2h / spec.link_bw
            transfer = np.maximum(h2d_s, d2h_s)
            longer, shorter = np.maximum(compute, transfer), np.minimum(compute, transfer)
            out.update({f"{name}_compute": compute, f"{name}_h2d": h2d_s, f"{name}_d2h": d2h_s,
                        name: longer + (1 - spec.overlap) * shorter})  # fmt: skip
        out["recompute"] = redo
        out["flush"] = (
            G * self.grad_block + P * self.param_block + self.nonblock_link
        ) / spec.link_bw
        out["optimizer"] = self.optimizer_s
        out["step"] = (
            self.rounds * (out["forward"] + out["backward"]) + out["optimizer"] + out["flush"]
        )

    def config(
        self, p: int, a: int, nf: int, na: int, spec: OffloadSpec, g: int | None = None
    ) -> OffloadConfig:
        """The report of one choice (the same ``evaluate`` the search ran)."""
        v = {k: np.asarray(x).item() for k, x in self.evaluate(p, a, nf, na, spec, g).items()}
        L, g = self.layers, int(v["pinned_grads"])
        tokens = self.seqs * self.rounds * self.seq
        decisions = {
            "chunk": self.chunk, "chunks_per_round": self.units // L, "seqs_per_round": self.seqs,
            "tokens_per_round": self.seqs * self.seq, "rounds": self.rounds,
            "pinned_params": p, "param_slots": min(p + 2, L) if p < L else L,
            "pinned_grads": g, "grad_slots": min(g + 2, L) if g < L else L, "device_units": a,
        }  # fmt: skip
        device = {**self.device_fixed, **{k: v[k] for k in ("param_blocks", "grad_blocks",
                  "activation_units", "activation_workspace")}}  # fmt: skip
        host = {**self.host_fixed, "streamed_weights": v["streamed_weights"],
                "activations": v["activations"]}  # fmt: skip
        times = {k: v[k] for k in ("forward_compute", "forward_h2d", "forward_d2h", "forward",
                 "backward_compute", "backward_h2d", "backward_d2h", "backward", "recompute",
                 "optimizer", "flush", "step")}  # fmt: skip
        units = {"full": nf, "attn": na, "ctx": int(v["ctx"])}
        fits = {k: bool(v[k]) for k in ("device_ok", "host_ok")}
        return OffloadConfig(decisions, units, device, host, times, tokens / v["step"], fits)


@functools.lru_cache(maxsize=64)
def _per_param_bytes(model: ModelSpec, train: TrainSpec) -> tuple[int, dict[str, int]]:
    """(blocks, parameters of one block and of the rest) from the parameter breakdown
    (cached: every chunk and round of a plan asks; sympy's substitution takes 20 ms)."""
    v = values_for(model, train)
    parts = {k: int(e.subs(v)) for k, e in param_breakdown(model).items()}
    L = model.n_layers
    block = int(block_params(model, norms=True).subs(v))
    return L, {"block": block, "rest": parts["total"] - L * block, "total": parts["total"]}


def block_terms(
    model: ModelSpec, train: TrainSpec, hw: Hardware, spec: OffloadSpec, chunk: int, seqs: int
) -> Terms:
    """Bytes and seconds of one (chunk, sequences per round)."""
    prec = PRECISIONS[train.precision]
    L, n = _per_param_bytes(model, train)
    w, g = prec.weight_copy or prec.param, prec.grad
    round_train = train.replace(batch=seqs, grad_accum=1, recompute="none")
    est = estimate(model, round_train, ParallelSpec(), hw)
    rate = est["flops.forward"] / est["time_s.compute_forward"]  # achieved, forward
    v = values_for(model, round_train)
    saved = {k: float(e.subs(v)) * chunk for k, e in saved_bytes_per_token(model, train).items()}
    redo = {k: float(e.subs(v)) * chunk / rate
            for k, e in recompute_flops_per_token(model, train).items()}  # fmt: skip
    tokens = seqs * train.seq
    return Terms(
        chunk=chunk, seq=train.seq, seqs=seqs, rounds=train.batch // seqs, layers=L,
        units=L * tokens // chunk,
        param_block=n["block"] * w, grad_block=n["block"] * g,
        unit={m: saved[m] for m in SAVE_MODES}, recompute_s={m: redo[m] for m in SAVE_MODES},
        forward_s=est["time_s.compute_forward"], backward_s=est["time_s.compute_backward"],
        optimizer_s=_optimizer_s(train, n["total"], spec),
        device_fixed=_device_fixed(model, train, spec, n["rest"], chunk, tokens),
        host_fixed=_host_fixed(train, n["total"], spec),
        stream_copies=bool(prec.weight_copy) or spec.optimizer_state == "nvme",
        nonblock_link=n["rest"] * (w + g),
    )  # fmt: skip


def _device_fixed(
    model: ModelSpec, train: TrainSpec, spec: OffloadSpec, rest: int, chunk: int, tokens: int
) -> dict[str, float]:
    """Embedding, head and final norm (weights and gradients), the head and loss's
    transient for one loss chunk, and (chunks shorter than a sequence) the block's K/V
    context for the round and its gradient."""
    prec = PRECISIONS[train.precision]
    v = values_for(model, train.replace(batch=1, grad_accum=1, seq=spec.loss_chunk))
    fwd, start, end = transient_bytes(model, train, prec.residual, 1)
    loss = float(smax(fwd, smax(start, end)).subs(v))
    context = 0.0
    if chunk < train.seq:
        context = 2.0 * tokens * float((2 * prec.activation * K * d_h).subs(v))
    return {"nonblock": rest * (prec.weight_copy or prec.param) + rest * prec.grad,
            "loss_workspace": loss, "context_workspace": context}  # fmt: skip


def _host_fixed(train: TrainSpec, total: int, spec: OffloadSpec) -> dict[str, float]:
    """Gradient accumulators for every parameter, and (optimizer state on the host) the
    master weights and the optimizer's moments."""
    prec = PRECISIONS[train.precision]
    on_host = spec.optimizer_state == "host"
    moments = optimizer_state_bytes(train.optimizer, train.precision, total)
    return {"grads": float(total * prec.grad),
            "master": float(total * prec.param) if on_host else 0.0,
            "optimizer": float(moments) if on_host else 0.0}  # fmt: skip


def _optimizer_s(train: TrainSpec, total: int, spec: OffloadSpec) -> float:
    """One fused CPU optimizer pass over every parameter (DeepSpeed CPU-Adam: read and
    write master and moments, read the gradient; ``optimizer_traffic``), writing the
    compute-dtype copy; with NVMe, reading and writing master and moments there."""
    prec = PRECISIONS[train.precision]
    passes = optimizer_traffic(train.optimizer, "fused", train.precision) + prec.weight_copy
    seconds = total * passes / spec.host_memory_bw
    if spec.optimizer_state == "nvme":
        state = prec.param + optimizer_state_bytes(train.optimizer, train.precision, 1)
        seconds += 2 * total * state / spec.nvme_bw
    return seconds
