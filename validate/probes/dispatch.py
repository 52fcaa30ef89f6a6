"""Kernels a training step dispatches, counted op by op (``costmodel.single.kernels``).

A ``TorchDispatchMode`` sees every ATen op the reference model runs, on the ``meta``
device as on a real one; views (ops whose schema returns an alias, and ``_unsafe_view``)
and scalar or type queries launch nothing and are not counted.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_NO_KERNEL = {"_unsafe_view", "promote_types", "lift_fresh", "_local_scalar_dense"}


class KernelCount(TorchDispatchMode):
    """Counts the kernels dispatched inside it, by op name (``counts``) and in all (``n``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in _NO_KERNEL and func.namespace == "aten":
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def n(self) -> int:
        return sum(self.counts.values())


def step_kernels(model: torch.nn.Module, batch) -> tuple[KernelCount, KernelCount]:
    """(forward, backward) kernel counts of one micro-batch of ``model`` (a
    ``TransformerLM``) on ``batch``."""
    with KernelCount() as fwd:
        loss = model(batch)
    with KernelCount() as bwd:
        loss.backward()
    return fwd, bwd
