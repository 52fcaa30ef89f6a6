"""Exact counts from torch itself: parameters, FLOPs and bytes kept for backward.

Runs on the ``meta`` device by default, so full-size models (405B) are counted in seconds
without memory. Each count is what torch reports, grouped like costmodel's breakdowns:

- parameters: ``numel`` of each named parameter (shared ones once), by component;
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode``, forward and backward, by op;
- ``saved_bytes``: every tensor packed by ``saved_tensors_hooks`` during forward,
  de-duplicated by storage, excluding parameters and their low-precision copies;
- ``live_bytes``: storages created during forward that are still alive after it (what
  backward will need, including checkpointed blocks' inputs that saved-tensor hooks do not
  see), excluding the loss; ``weight_copy_bytes``: live casts of parameters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from costmodel.single.memory import INDEX_BYTES
from costmodel.specs.model import ModelSpec, TrainSpec
from validate.reference.lora import NF4Linear
from validate.reference.model import TransformerLM, make_batch

_PARAM_GROUPS = (  # (substring of the parameter name, costmodel component); first match wins
    (".lora_", "adapters"),
    ("embed.", "embedding"),
    ("pos.", "pos_embedding"),
    (".attn.q.", "attn_q"),
    (".attn.q_a.", "attn_q"),  # MLA: the query's latent and up-projection,
    (".attn.q_b.", "attn_q"),
    (".attn.kv_a.", "attn_k"),  # the key/value latent (and RoPE key),
    (".attn.kv_b.", "attn_v"),  # their up-projection
    (".attn.k.", "attn_k"),
    (".attn.v.", "attn_v"),
    (".attn.o.", "attn_o"),
    (".ffn.router.", "router"),
    (".ffn.shared_gate.", "router"),
    (".ffn.experts.", "experts"),
    (".ffn.shared.", "shared_experts"),
    (".ffn.", "ffn"),
    ("norm", "norms"),
    ("lm_head.", "lm_head"),
)
_OP_GROUPS = (  # module path suffix -> costmodel op; the attention core holds both T x T matmuls
    (".attn.q", "attn_q"),
    (".attn.q_a", "attn_q"),
    (".attn.q_b", "attn_q"),
    (".attn.kv_a", "attn_k"),
    (".attn.kv_b", "attn_v"),
    (".attn.k", "attn_k"),
    (".attn.v", "attn_v"),
    (".attn.o", "attn_o"),
    (".attn.core", "attn_core"),
    (".ffn.w1", "ffn"),
    (".ffn.w2", "ffn"),
    (".ffn.w3", "ffn"),
    (".lm_head", "lm_head"),
)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class StorageTracker(TorchDispatchMode):
    """Records the storage of every op output; knows which are casts of parameters."""

    def __init__(self, param_keys: set[int], track_peak: bool = False) -> None:
        super().__init__()
        self.param_keys = param_keys
        self.refs: dict[int, tuple[StorageWeakRef, int]] = {}
        self.weight_copies: set[int] = set()
        self.track_peak = track_peak
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        is_cast = func is torch.ops.aten._to_copy.default and _key(args[0]) in self.param_keys
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _key(t) not in self.param_keys:
                key = _key(t)
                known = self.refs.get(key)
                if known is None or known[0].expired():
                    storage = t.untyped_storage()
                    self.refs[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.weight_copies.discard(key)
                if is_cast:
                    self.weight_copies.add(key)
        if self.track_peak:
            self.peak_bytes = max(self.peak_bytes, self.live_bytes())
        return out

    def live_bytes(self) -> int:
        """Bytes of recorded storages alive now (forgets the dead ones)."""
        dead = [k for k, (ref, _) in self.refs.items() if ref.expired()]
        for k in dead:
            del self.refs[k]
            self.weight_copies.discard(k)
        return sum(n for _, n in self.refs.values())

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes()

    def alive(self) -> dict[int, int]:
        """Storage key -> bytes of every recorded storage still alive."""
        return {k: n for k, (ref, n) in self.refs.items() if not ref.expired()}


@dataclass(frozen=True)
class Counts:
    """Exact counts of one configuration (one micro-batch; bytes, FLOPs, parameters)."""

    params: dict[str, int]
    flops_forward: dict[str, int]
    flops_backward: dict[str, int]
    """Backward FLOPs; only ``total`` is exact (per-module attribution is approximate)."""
    saved_bytes: int
    live_bytes: int
    weight_copy_bytes: int


def _state_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The model's own tensors: parameters and buffers (QLoRA's NF4 codes and constants)."""
    return [*model.parameters(), *model.buffers()]


def count_params(model: torch.nn.Module) -> dict[str, int]:
    """Parameters by costmodel component, plus ``total`` (shared parameters once; the
    model's own, LoRA adapters apart) and ``trainable`` (those with a gradient). A matrix
    QLoRA holds in NF4 counts its weights."""
    parts: dict[str, int] = defaultdict(int)
    quantized = [
        (f"{n}.weight", m.numel) for n, m in model.named_modules() if isinstance(m, NF4Linear)
    ]
    for name, numel in [(n, p.numel()) for n, p in model.named_parameters()] + quantized:
        group = next((g for sub, g in _PARAM_GROUPS if sub in f".{name}"), None)
        if group is None:
            raise KeyError(f"parameter {name} belongs to no costmodel component")
        parts[group] += numel
    parts["total"] = sum(n for g, n in parts.items() if g != "adapters")
    parts["trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dict(parts)


def _op_group(module: str) -> str | None:
    """costmodel's op for a module path (an MoE FFN's router, routed and shared experts)."""
    for part, group in ((".ffn.router", "router"), (".ffn.shared_gate", "router"),
                        (".ffn.experts.", "experts"),
                        (".ffn.shared.", "shared_experts")):  # fmt: skip
        if part in module and (group == "router" or module[-3:] in (".w1", ".w2", ".w3")):
            return group
    return next((g for suffix, g in _OP_GROUPS if module.endswith(suffix)), None)


def _flops_by_op(counts: dict[str, dict]) -> dict[str, int]:
    """FLOPs by costmodel op; a LoRA-wrapped matrix's own are its ``base``'s, its
    adapters' the ``lora`` op's."""
    ops: dict[str, int] = defaultdict(int)
    for module, per_op in counts.items():
        if f"{module}.base" in counts:
            continue  # a LoRA wrapper: its base and adapters are counted apart
        group = _op_group(module.removesuffix(".base"))
        if module.endswith((".lora_a", ".lora_b")):
            group = "lora"
        if group is not None:
            ops[group] += sum(per_op.values())
    ops["total"] = sum(counts.get("Global", {}).values())
    return dict(ops)


def _snapshot(counter: FlopCounterMode) -> dict[str, dict]:
    return {m: dict(c) for m, c in counter.get_flop_counts().items()}


def _minus(after: dict[str, dict], before: dict[str, dict]) -> dict[str, dict]:
    return {
        m: {op: n - before.get(m, {}).get(op, 0) for op, n in c.items()} for m, c in after.items()
    }


def count(spec: ModelSpec, train: TrainSpec, device: str | torch.device = "meta") -> Counts:
    """Build the reference model on ``device``, run one forward and backward, count."""
    model = TransformerLM.for_training(spec, train, device)
    params = {_key(p) for p in _state_tensors(model)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[_key(t)] = t.untyped_storage().nbytes()
        return t

    tracker = StorageTracker(params)
    # One counter for both passes: its module tracker attributes backward ops to modules
    # through hooks installed during forward.
    with FlopCounterMode(display=False) as counter:
        with tracker:
            batch = make_batch(model, train.micro_batch, train.seq, device=device)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model(batch)
        forward = _snapshot(counter)
        alive = tracker.alive()
        alive.pop(_key(loss), None)
        copies = sum(n for k, n in alive.items() if k in tracker.weight_copies)
        loss.backward()
        backward = _minus(_snapshot(counter), forward)
    excluded = params | tracker.weight_copies
    return Counts(
        params=count_params(model),
        flops_forward=_flops_by_op(forward),
        flops_backward=_flops_by_op(backward),
        saved_bytes=sum(n for k, n in saved.items() if k not in excluded),
        live_bytes=sum(alive.values()) - copies,
        weight_copy_bytes=copies,
    )


_FLOP_OPS = ("attn_q", "attn_k", "attn_v", "attn_o", "ffn", "router", "experts", "shared_experts",
             "lm_head", "lora")  # fmt: skip


def compare(spec: ModelSpec, train: TrainSpec, device: str = "meta") -> list[dict]:
    """Predicted vs counted, one row per exact quantity (``grad_accum`` must be 1).

    Rows: ``{"quantity", "predicted", "measured"}``. Saved-tensor bytes are compared where
    every input is saved (an FFN-only stack under mixed precision saves only the cast of its
    input, which stays alive through the caller: it is in ``live_bytes``, not ``saved``).
    """
    from costmodel.engine.estimate import estimate

    if train.grad_accum != 1:
        raise ValueError(f"grad_accum must be 1 for accounting (got {train.grad_accum})")
    est, got = estimate(spec, train).values, count(spec, train, device)
    acts = est["memory_bytes.activations"]
    copies = est["memory_bytes.params"] if est["memory_bytes.master"] else 0
    rows = [
        ("params.total", est["params.total"], got.params["total"]),
        ("flops.forward", est["flops.forward"], got.flops_forward["total"]),
        ("flops.backward", est["flops.backward"], got.flops_backward["total"]),
        ("memory_bytes.activations", acts, got.live_bytes),
        ("memory_bytes.weight_copies", copies, got.weight_copy_bytes),
    ]
    rows += [(f"params.{k}", est[f"params.{k}"], n) for k, n in got.params.items() if k != "total"]
    # Per op in forward only: FlopCounterMode's module tracker attributes backward ops to
    # modules approximately (neighbouring leaves' backward windows overlap); totals are exact.
    by_op, counted = "flops.forward_by_op", got.flops_forward
    rows += [
        (f"{by_op}.{op}", est[f"{by_op}.{op}"], counted.get(op, 0))
        for op in _FLOP_OPS
        if f"{by_op}.{op}" in est
    ]
    if not spec.ffn_only:
        core = est[f"{by_op}.attn_scores"] + est[f"{by_op}.attn_values"]
        rows.append((f"{by_op}.attn_core", core, counted.get("attn_core", 0)))
    if train.recompute == "none":
        unsaved_input = (
            est["memory_bytes.activations_by_op.inputs"] if (spec.ffn_only and copies) else 0
        )
        if train.finetune != "full":  # the caller's token ids: a frozen embedding keeps none
            unsaved_input = INDEX_BYTES * train.micro_batch * train.seq
        rows.append(("memory_bytes.saved_for_backward", acts - unsaved_input, got.saved_bytes))
    return [{"quantity": q, "predicted": p, "measured": m} for q, p, m in rows]


def measure_peaks(spec: ModelSpec, train: TrainSpec, device: str = "meta") -> dict[str, int]:
    """High-water marks of live tensor bytes, parameters included, keyed as costmodel's.

    ``peak_forward`` and ``peak_forward_backward``: one forward (with autograd) and backward,
    no optimizer, no gradients before. ``peak``: the second training step (the optimizer
    state exists; foreach AdamW or SGD; gradients set to None between steps). A
    fragmentation-free allocator: ``torch.cuda.max_memory_allocated`` minus its rounding.
    """
    model = TransformerLM.for_training(spec, train, device)
    params = {_key(p): p.untyped_storage().nbytes() for p in _state_tensors(model)}
    static = sum(params.values())
    tracker = StorageTracker(set(params), track_peak=True)
    peaks: dict[str, int] = {}
    with tracker:
        _micro_steps(model, train, device, tracker, peaks)
        peaks["peak_forward_backward"] = tracker.peak_bytes
        model.zero_grad(set_to_none=True)
        trained = (p for p in model.parameters() if p.requires_grad)
        optimizer = make_optimizer(trained, train)
        for _ in range(2):
            tracker.reset_peak()
            _micro_steps(model, train, device, tracker, {})
            if optimizer is not None:
                optimizer.step()
            model.zero_grad(set_to_none=True)
        peaks["peak"] = tracker.peak_bytes
    return {k: v + static for k, v in peaks.items()}


def _micro_steps(model, train, device, tracker, peaks) -> None:
    for _ in range(train.grad_accum):
        batch = make_batch(model, train.micro_batch, train.seq, device=device)
        loss = model(batch)
        peaks.setdefault("peak_forward", tracker.peak_bytes)
        loss.backward()
        del loss


def make_optimizer(params, train: TrainSpec) -> torch.optim.Optimizer | None:
    """The torch optimizer a TrainSpec names, in its implementation (foreach or fused)."""
    params, impl = list(params), {train.optimizer_impl: True}
    if train.optimizer in ("adamw", "adam"):
        cls = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-3, **impl)
    if train.optimizer in ("sgd", "sgd-momentum"):
        momentum = 0.9 if train.optimizer == "sgd-momentum" else 0.0
        return torch.optim.SGD(params, lr=1e-3, momentum=momentum, **impl)
    return None
