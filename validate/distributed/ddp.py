"""Data parallelism by hand: four gradient-synchronisation strategies and ZeRO-1.

Every wrapper broadcasts rank 0's parameters and buffers at construction, synchronises each
distinct trainable parameter once (tied weights are one parameter; frozen ones are
skipped) and averages gradients over ranks; call ``finish_gradient_synchronization()``
after ``backward()`` and before ``optimizer.step()``.

- ``NaiveDDP``: one all-reduce per parameter after backward;
- ``FlatDDP``: one all-reduce of all gradients flattened into a single buffer;
- ``OverlapDDP``: an async all-reduce per parameter as soon as its gradient is accumulated
  (``register_post_accumulate_grad_hook``), overlapping communication with backward;
- ``BucketedDDP(module, bucket_size_mb)``: parameters in reverse order (the order backward
  produces gradients) packed into buckets of at most ``bucket_size_mb``; a bucket's
  flattened all-reduce starts when its last gradient is ready (as torch DDP, Li et al.
  2020, Sec. 3.2.3).

``ShardedOptimizer(params, optimizer_cls, **kwargs)`` is ZeRO stage 1 (Rajbhandari et al.
2020): each rank keeps the optimizer state of its shard of the parameters only, steps it,
and broadcasts the updated parameters from their owner.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from costmodel.parallel.collectives import bucket_indices


class _DataParallel(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        self.params = [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError


class NaiveDDP(_DataParallel):
    def finish_gradient_synchronization(self) -> None:
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world)


class FlatDDP(_DataParallel):
    def finish_gradient_synchronization(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.world)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(synced)


class OverlapDDP(_DataParallel):
    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self._pending: list[tuple[dist.Work, nn.Parameter]] = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._launch)

    def _launch(self, p: nn.Parameter) -> None:
        self._pending.append((dist.all_reduce(p.grad, async_op=True), p))

    def finish_gradient_synchronization(self) -> None:
        for work, p in self._pending:
            work.wait()
            p.grad.div_(self.world)
        self._pending.clear()


class BucketedDDP(_DataParallel):
    def __init__(self, module: nn.Module, bucket_size_mb: float) -> None:
        super().__init__(module)
        if not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be > 0 (got {bucket_size_mb})")
        sizes = [p.numel() * p.element_size() for p in self.params]
        order = list(reversed(self.params))
        self.buckets = [[order[i] for i in b] for b in bucket_indices(sizes, bucket_size_mb)]
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._ready = [0] * len(self.buckets)
        self._pending: dict[int, tuple[dist.Work, torch.Tensor]] = {}
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._mark_ready)

    def _mark_ready(self, p: nn.Parameter) -> None:
        i = self._bucket_of[id(p)]
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i: int) -> None:
        grads = [_grad_or_zeros(p) for p in self.buckets[i]]
        flat = _flatten_dense_tensors(grads)
        self._pending[i] = (dist.all_reduce(flat, async_op=True), flat)

    def finish_gradient_synchronization(self) -> None:
        for i in range(len(self.buckets)):  # buckets whose parameters got no gradient
            if i not in self._pending:
                self._launch(i)
        for i, (work, flat) in sorted(self._pending.items()):
            work.wait()
            flat.div_(self.world)
            params = self.buckets[i]
            grads = [_grad_or_zeros(p) for p in params]
            for p, synced in zip(params, _unflatten_dense_tensors(flat, grads), strict=True):
                p.grad = synced.clone() if p.grad is None else p.grad.copy_(synced)
        self._pending.clear()
        self._ready = [0] * len(self.buckets)


def _grad_or_zeros(p: nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: ``ShardedOptimizer(params, torch.optim.AdamW, lr=1e-3)``."""

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._owner: dict[int, int] = {}
        self._loads = [0] * self.world
        self._local: torch.optim.Optimizer | None = None
        self._cls, self._kwargs = optimizer_cls, kwargs
        super().__init__(params, defaults=kwargs)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        # largest first, each to the least-loaded rank (LPT): shards of nearly equal numel
        for p in sorted(group["params"], key=lambda p: -p.numel()):
            owner = min(range(self.world), key=lambda r: (self._loads[r], r))
            self._owner[id(p)] = owner
            self._loads[owner] += p.numel()
        mine = [p for p in group["params"] if self._owner[id(p)] == self.rank]
        local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
        if self._local is None:
            self._local = self._cls([local_group], **self._kwargs)
        else:
            self._local.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure=None, **kwargs: Any):
        loss = self._local.step(closure, **kwargs) if self._local is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self._owner[id(p)])
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds."""
        if self._local is None:
            return 0
        return sum(
            t.numel() * t.element_size()
            for state in self._local.state.values()
            for t in state.values()
            if isinstance(t, torch.Tensor) and t.numel() > 1
        )
