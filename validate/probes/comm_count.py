"""Every collective of a training step, with its bytes, seen at the dispatcher.

``CollectiveCounter`` is a TorchDispatchMode: c10d collectives (FSDP2's all-gather and
reduce-scatter, DDP's all-reduce) and the functional collectives DTensor emits pass
through the dispatcher as ops, so it sees each one with its tensors. Sizes are the full
tensor of each collective (all-gather: output; reduce-scatter, all-reduce: input), and
``ring_bytes`` converts them into the bytes one rank sends in a ring, the quantity
``costmodel``'s ``comm_bytes.*`` predict.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from costmodel.parallel.collectives import bus_factor

# op name prefix -> (collective, index of the argument whose size is the collective's)
_OPS = {
    "c10d._allgather_base_": ("all_gather", 0),
    "c10d.allgather_into_tensor_coalesced_": ("all_gather", 0),
    "c10d._reduce_scatter_base_": ("reduce_scatter", 1),
    "c10d.reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "c10d.allreduce_": ("all_reduce", 0),
    "c10d.broadcast_": ("broadcast", 0),
    "_c10d_functional.all_reduce": ("all_reduce", 0),
    "_c10d_functional.all_gather_into_tensor": ("all_gather", -1),
    "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter", 0),
}


def _nbytes(value) -> int:
    return sum(
        t.numel() * t.element_size() for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)
    )


class CollectiveCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.sizes: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func).rsplit(".", 1)[0]
        if name in _OPS:
            kind, index = _OPS[name]
            self.calls[kind] += 1
            self.sizes[kind] += _nbytes(out if index == -1 else args[index])
        return out

    def ring_bytes(self, world: int) -> float:
        """Bytes one rank sends over all counted collectives, ring algorithms."""
        return sum(bus_factor(kind, world) * size for kind, size in self.sizes.items())
