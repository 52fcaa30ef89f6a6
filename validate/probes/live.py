"""Live tensor bytes of this process and their high-water mark, on CPU as on CUDA.

CUDA: the caching allocator's counters (``memory_allocated``, ``max_memory_allocated``).
CPU: a ``TorchDispatchMode`` records the storage of every op's output, plus the storages
that exist when it starts (parameters, buffers, optimizer state: :meth:`LiveBytes.hold`),
and sums the *current* size of those alive after every op. Current, not creation-time:
FSDP2 frees an unsharded parameter by resizing its storage to zero and re-allocates it
the same way (``untyped_storage().resize_``), which no op reports. An op on DTensors is
handed back to DTensor first, so its local ops, redistributions included, are seen
one by one (not only the wrapped result). Bytes are storage
bytes, as the CUDA counters count them before the allocator's 512-byte rounding.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class _StorageMode(TorchDispatchMode):
    """Weak references to every storage an op writes or any caller holds."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, StorageWeakRef] = {}
        self.peak = 0

    def add(self, t: torch.Tensor) -> None:
        storage = _local(t).untyped_storage()
        key = storage._cdata
        known = self.refs.get(key)
        if known is None or known.expired():
            self.refs[key] = StorageWeakRef(storage)

    def live(self) -> int:
        total, dead = 0, []
        for key, ref in self.refs.items():
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            if storage is None:
                dead.append(key)
            else:
                total += storage.nbytes()
        for key in dead:
            del self.refs[key]
        return total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor runs first; its local ops come back here
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.add(t)
        self.peak = max(self.peak, self.live())
        return out


class LiveBytes:
    """``with LiveBytes(device) as mem: ...``; ``mem.now()``, ``mem.peak()``,
    ``mem.reset_peak()``; ``mem.hold(tensors)`` counts tensors made before (CPU only:
    CUDA's counters already see every allocation)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._mode = _StorageMode() if device.type != "cuda" else None

    def __enter__(self) -> LiveBytes:
        if self._mode is not None:
            self._mode.__enter__()
        self.reset_peak()
        return self

    def __exit__(self, *exc) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)

    def hold(self, tensors: Iterable[torch.Tensor]) -> None:
        if self._mode is not None:
            for t in tensors:
                self._mode.add(t)
            self._mode.peak = max(self._mode.peak, self._mode.live())

    def now(self) -> int:
        if self._mode is None:
            torch.cuda.synchronize(self.device)
            return torch.cuda.memory_allocated(self.device)
        return self._mode.live()

    def peak(self) -> int:
        if self._mode is None:
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device)
        return self._mode.peak

    def reset_peak(self) -> None:
        if self._mode is None:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._mode.peak = self._mode.live()


def state_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct local storages behind ``tensors`` (a DTensor's shard only)."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = _local(t).untyped_storage()
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's state tensors (moments; scalar steps included)."""
    return [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
