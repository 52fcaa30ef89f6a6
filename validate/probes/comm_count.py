"""Every collective of a training step, with its bytes, seen at the dispatcher.

``CollectiveCounter`` is a TorchDispatchMode: c10d collectives (FSDP2's all-gather and
reduce-scatter, DDP's all-reduce) and the functional collectives DTensor emits pass
through the dispatcher as ops, so it sees each one with its tensors. An op on DTensors is
handed back to DTensor first (``NotImplemented``, as torch's ``CommDebugMode`` does), so the
collectives DTensor issues inside an op (loss parallelism's all-reduces, implicit
redistributions) reach the counter too, not only those between ops. Sizes are the full
tensor of each collective (all-gather: output; reduce-scatter, all-reduce: input), and
``ring_bytes`` converts them into the bytes one rank sends in a ring, the quantity
``costmodel``'s ``comm_bytes.*`` predict.

It also times every counted call (``seconds``): ``time.perf_counter`` around the call and
its completion (the c10d op's ``Work`` or the functional collective's ``wait_tensor`` is
waited inside the timed span, and CUDA is synchronized before and after), so the sum is the
time this rank spent in collectives, ``costmodel``'s ``comm_time_s.*``; never negative.
Waiting at once serialises what the step would have overlapped, which a byte count ignores.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch
from torch._C._distributed_c10d import Work
from torch.distributed.tensor import DTensor
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


def _sync_cuda() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _wait(name: str, out: Any) -> None:
    """Block until the collective that returned ``out`` has finished."""
    if name.startswith("_c10d_functional."):  # returns at once; wait_tensor completes it
        torch.ops._c10d_functional.wait_tensor(out)
        return
    for item in tree_flatten(out)[0]:  # c10d ops return (tensors, Work)
        if isinstance(item, torch.ScriptObject):
            Work.unbox(item).wait()


class CollectiveCounter(TorchDispatchMode):
    """Calls, full-tensor bytes and seconds of every collective run inside ``with``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.sizes: dict[str, int] = defaultdict(int)
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor desugar first: its collectives come back here
        name = str(func).rsplit(".", 1)[0]
        if name not in _OPS:
            return func(*args, **(kwargs or {}))
        _sync_cuda()
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        _wait(name, out)
        _sync_cuda()
        self.seconds += time.perf_counter() - start
        kind, index = _OPS[name]
        self.calls[kind] += 1
        self.sizes[kind] += _nbytes(out if index == -1 else args[index])
        return out

    def ring_bytes(self, world: int) -> float:
        """Bytes one rank sends over all counted collectives, ring algorithms."""
        return sum(bus_factor(kind, world) * size for kind, size in self.sizes.items())
