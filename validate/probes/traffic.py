"""Bytes the elementwise ops of one block move in eager mode, counted from torch's dispatch.

Every op torch dispatches during a forward and a backward of the reference model on the
``meta`` device is recorded with the bytes of its tensor inputs and outputs, except views,
allocations, matmuls and the fused attention kernels (timed by their own roofline). The
per-token, per-layer figure is the part that grows with both depth and sequence length:
``(N(L=2, T2) - N(L=1, T2) - N(L=2, T1) + N(L=1, T1)) / (T2 - T1)``, which removes the
embedding, head, loss and per-layer weight casts, and the reads of tables shared by all
tokens. ``costmodel.single.elementwise.eager_bytes`` states the same in closed form.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from costmodel.specs.model import ModelSpec, TrainSpec
from validate.reference.model import _FUSED_ATTENTION, _MATMULS, TransformerLM, make_batch

_CPU_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_SKIPPED = _MATMULS | _FUSED_ATTENTION | {torch.ops.aten.bmm.default, _CPU_FLASH_BWD}
_ALLOCATIONS = {  # no data read; _unsafe_view only renames a matmul's output
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "full",
    "new_empty", "new_empty_strided", "new_zeros", "_unsafe_view", "detach",
}  # fmt: skip


class TrafficCounter(TorchDispatchMode):
    """Sums the bytes of the tensors each counted op reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _SKIPPED or func.is_view or func.overloadpacket.__name__ in _ALLOCATIONS:
            return out
        tensors = tree_flatten((args, kwargs, out))[0]
        self.bytes += sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))
        return out


def _count(
    spec: ModelSpec, precision: str, layers: int, seq: int, dropout: float
) -> tuple[int, int]:
    train = TrainSpec(batch=1, seq=seq, precision=precision, attention="flash", dropout=dropout)
    model = TransformerLM.for_training(spec.replace(n_layers=layers), train, "meta")
    batch = make_batch(model, 1, seq, device="meta")
    with TrafficCounter() as fwd:
        loss = model(batch)
    with TrafficCounter() as bwd:
        loss.backward()
    return fwd.bytes, bwd.bytes


def eager_traffic(
    spec: ModelSpec, precision: str, seqs: tuple[int, int] = (64, 128), dropout: float = 0.0
):
    """(forward, backward) bytes per token per layer of the eager elementwise ops (with
    ``dropout``, FFN-only models: the CPU flash kernel has no dropout)."""
    t1, t2 = seqs
    n = {(L, t): _count(spec, precision, L, t, dropout) for L in (1, 2) for t in (t1, t2)}
    per = [(n[2, t2][i] - n[1, t2][i] - n[2, t1][i] + n[1, t1][i]) for i in (0, 1)]
    return tuple(p / (t2 - t1) for p in per)
