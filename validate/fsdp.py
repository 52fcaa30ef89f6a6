"""Fully sharded data parallelism by hand (ZeRO-3; Rajbhandari et al. 2020, Sec. 5.3).

``FSDP(module, compute_dtype=None)`` shards every parameter with two or more dimensions
(matmul and embedding weights, whatever their module's class) over the ranks: each keeps a
flat fp32 slice of ``ceil(numel / world)`` elements (zero-padded). Parameters with fewer
dimensions (norm weights, biases) are replicated; their gradients are all-reduced and
averaged by :meth:`FSDP.finish_gradient_synchronization`.

Per module that owns parameters: a forward pre-hook all-gathers its sharded weights (cast
to ``compute_dtype`` first, so the all-gather moves compute-dtype bytes) and a post-hook
drops them; autograd's saved-tensor hooks store a weight the forward saved for backward as
a marker, and gather it again when backward needs it, so a full weight lives only while its
module runs, forward or backward. A gathered weight's gradient (compute dtype) is cast to
fp32 and reduce-scattered (summed) into its shard's ``.grad``, then divided by the world
size, so the optimizer steps the fp32 shards over the ranks' mean gradient.

``all_gather`` and ``reduce_scatter`` replace torch.distributed's (``(output, input)``;
``validate.distributed.memory`` passes gloo versions that settle before returning).

Use: ``model = FSDP(module)``; ``model(x)`` ... ``loss.backward()``;
``model.finish_gradient_synchronization()``; ``optimizer.step()`` over
``model.parameters()`` (the shards and the replicated parameters);
``model.gather_full_params()`` gives ``{name: full fp32 tensor}`` named as
``module.named_parameters()`` named them. Parameters shared by two modules are not supported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

Collective = Callable[[torch.Tensor, torch.Tensor], Any]
"""``(output, input)``: an all-gather of every rank's ``input`` into ``output``, or a
reduce-scatter (the sum over the ranks of ``input``, this rank's chunk into ``output``)."""


def all_gather(output: torch.Tensor, shard: torch.Tensor) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, shard)


class _Comms(NamedTuple):
    all_gather: Collective
    reduce_scatter: Collective


class _Sharded:
    """One sharded parameter: its flat fp32 shard, full shape and owner."""

    def __init__(
        self, name: str, param: nn.Parameter, rank: int, world: int, comms: _Comms
    ) -> None:
        self.name, self.shape, self.numel = name, param.shape, param.numel()
        self.comms = comms
        self.chunk = math.ceil(self.numel / world)
        flat = torch.zeros(self.chunk * world, dtype=torch.float32, device=param.device)
        flat[: self.numel] = param.detach().reshape(-1).float()
        self.shard = nn.Parameter(flat[rank * self.chunk : (rank + 1) * self.chunk].clone())

    def gather(self, dtype: torch.dtype) -> torch.Tensor:
        """The full weight in ``dtype`` (no autograd): all-gather of every rank's shard."""
        flat = torch.empty(
            self.chunk * dist.get_world_size(), dtype=dtype, device=self.shard.device
        )
        self.comms.all_gather(flat, self.shard.detach().to(dtype))
        return flat[: self.numel].view(self.shape)


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Gather(torch.autograd.Function):
    """Forward: the full weight from the shards. Backward: the weight's gradient, fp32,
    reduce-scattered into the shard's gradient and averaged over the ranks."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, owner: _Sharded, dtype: torch.dtype) -> Any:
        ctx.owner = owner
        return owner.gather(dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        owner, world = ctx.owner, dist.get_world_size()
        flat = torch.zeros(owner.chunk * world, dtype=torch.float32, device=grad.device)
        flat[: owner.numel] = grad.reshape(-1).float()
        out = torch.empty(owner.chunk, dtype=torch.float32, device=grad.device)
        owner.comms.reduce_scatter(out, flat)
        return out.div_(world), None, None


class FSDP(nn.Module):
    """``module`` with its two-or-more-dimensional parameters sharded over the ranks."""

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        all_gather: Collective = all_gather,
        reduce_scatter: Collective = dist.reduce_scatter_tensor,
    ) -> None:
        super().__init__()
        comms = _Comms(all_gather, reduce_scatter)
        self.module, self.compute_dtype = module, compute_dtype
        rank, world = dist.get_rank(), dist.get_world_size()
        with torch.no_grad():  # one starting point: rank 0's weights
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
        every = list(module.named_parameters(remove_duplicate=False))
        names = {id(p): n for n, p in every}
        if len(names) != len(every):
            raise ValueError("FSDP: a parameter shared by two modules is not supported")
        self.sharded: dict[str, _Sharded] = {}
        self.replicated = nn.ParameterDict()
        self._owned: dict[nn.Module, list[tuple[str, str]]] = {}  # module: (attr, name)
        for sub in module.modules():
            for attr, p in list(sub.named_parameters(recurse=False)):
                name = names[id(p)]
                del sub._parameters[attr]
                if p.dim() >= 2:
                    self.sharded[name] = _Sharded(name, p, rank, world, comms)
                else:
                    self.replicated[name.replace(".", "/")] = p
                self._owned.setdefault(sub, []).append((attr, name))
        self.shards = nn.ParameterList(s.shard for s in self.sharded.values())
        self._live: dict[int, str] = {}  # storage address of a gathered weight: its name
        for sub in self._owned:
            sub.register_forward_pre_hook(self._materialise)
            sub.register_forward_hook(self._release)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            return self.module(*args, **kwargs)

    def _dtype(self, p: torch.Tensor) -> torch.dtype:
        return self.compute_dtype or p.dtype

    def _materialise(self, sub: nn.Module, _args: Any) -> None:
        for attr, name in self._owned[sub]:
            if name in self.sharded:
                owner = self.sharded[name]
                full = _Gather.apply(owner.shard, owner, self._dtype(owner.shard))
                self._live[_address(full)] = name
            else:  # a differentiable copy or view, never the Parameter (setattr would register it)
                p = self.replicated[name.replace(".", "/")]
                full = p.to(self.compute_dtype) if self.compute_dtype else p.view_as(p)
            setattr(sub, attr, full)

    def _release(self, sub: nn.Module, _args: Any, _out: Any) -> None:
        for attr, name in self._owned[sub]:
            value = sub.__dict__.pop(attr, None)
            if name in self.sharded and value is not None:
                self._live.pop(_address(value), None)

    def _pack(self, t: torch.Tensor) -> Any:
        """A gathered weight (or a view of one: same storage) is saved as where to find it."""
        name = self._live.get(_address(t))
        if name is None:
            return t
        return ("gathered", name, t.size(), t.stride(), t.storage_offset())

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not (isinstance(packed, tuple) and packed and packed[0] == "gathered"):
            return packed
        _, name, size, stride, offset = packed
        owner = self.sharded[name]
        with torch.no_grad():
            full = owner.gather(self._dtype(owner.shard))
        return full.as_strided(size, stride, offset)

    def finish_gradient_synchronization(self) -> None:
        """Average the replicated parameters' gradients over the ranks (the shards' were
        reduce-scattered during backward)."""
        world = dist.get_world_size()
        for p in self.replicated.values():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(world)

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter at full size in fp32, named as ``module.named_parameters()``."""
        out = {name: s.gather(torch.float32).clone() for name, s in self.sharded.items()}
        out.update({k.replace("/", "."): p.detach().clone() for k, p in self.replicated.items()})
        return out
