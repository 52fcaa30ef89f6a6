"""The hand-written FSDP (``validate.fsdp``) against single-process training.

A toy LM with an embedding, an RMSNorm and linears (``nn.Linear``, or a class of its own)
trains for a few SGD steps under ``FSDP`` (or the naive DDP) on each rank's slice of the
batch, and in one process on the whole batch split the same way (the slices' gradients
summed, then halved, as the ranks' reduce-scatter does). One thread per process, so both
run the same kernels in the same order: in fp32 the parameters must be equal bit for bit.
The same process on the unsplit batch is returned too: its weight gradients sum all rows in
one matmul where the ranks sum two halves and add them, so it differs by rounding (about
3e-8 after 3 steps, for DDP exactly as for FSDP; floating-point addition is not
associative), which no data-parallel run can reproduce.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from validate.distributed.checks import VOCAB, batches
from validate.distributed.ddp import NaiveDDP
from validate.fsdp import FSDP

DIM, HIDDEN, LR = 32, 48, 0.1
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Dense(nn.Module):
    """y = x Wᵀ + b, a linear layer that is not ``nn.Linear``."""

    def __init__(self, n_in: int, n_out: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / n_in**0.5)
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight.t()
        return y if self.bias is None else y + self.bias


class Norm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


LINEARS: dict[str, type[nn.Module]] = {"dense": Dense, "nn.Linear": nn.Linear}


class ToyLM(nn.Module):
    def __init__(self, depth: int = 2, linear: str = "dense") -> None:
        super().__init__()
        cls = LINEARS[linear]
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norms = nn.ModuleList(Norm(DIM) for _ in range(depth))
        self.ups = nn.ModuleList(cls(DIM, HIDDEN) for _ in range(depth))
        self.downs = nn.ModuleList(cls(HIDDEN, DIM, bias=False) for _ in range(depth))
        self.final = Norm(DIM)
        self.head = cls(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=True):
            x = x + down(torch.tanh(up(norm(x))))
        return self.head(self.final(x))


def _loss(logits: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), data[:, 1:].reshape(-1))


def _train_slices(model: nn.Module, rank: int, world: int, steps: int) -> None:
    """SGD steps of a data-parallel wrapper on this rank's slice of each batch."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for data in batches(steps):
        local = data.chunk(world)[rank]
        opt.zero_grad()
        _loss(model(local[:, :-1]), local).backward()
        model.finish_gradient_synchronization()
        opt.step()


def fsdp_run(
    rank: int, world: int, steps: int, dtype: str, linear: str = "dense"
) -> dict[str, Any]:
    """Train under FSDP on this rank's slice; full parameters, gradient shapes and dtypes,
    and the replicated parameters' gradients of the last step."""
    torch.set_num_threads(1)
    torch.manual_seed(0 if rank == 0 else 100 + rank)  # FSDP's broadcast fixes ranks > 0
    compute = None if dtype == "fp32" else DTYPES[dtype]
    model = FSDP(ToyLM(linear=linear), compute_dtype=compute)
    _train_slices(model, rank, world, steps)
    grads = [(tuple(p.grad.shape), tuple(p.shape), p.grad.dtype) for p in model.parameters()]
    replicated = {k: p.grad.clone() for k, p in model.replicated.items()}
    out = {"params": model.gather_full_params(), "grads": grads, "replicated": replicated}
    if rank == 0:  # the single-process runs, in a process set up as the ranks are
        out["reference"] = reference_run(steps, dtype, world, linear)
        out["unsplit"] = reference_run(steps, dtype, 1, linear)
    return out


def ddp_run(rank: int, world: int, steps: int, linear: str = "dense") -> dict[str, Any]:
    """The same fp32 training under the naive DDP: its full parameters."""
    torch.set_num_threads(1)
    torch.manual_seed(0 if rank == 0 else 100 + rank)
    module = ToyLM(linear=linear)
    _train_slices(NaiveDDP(module), rank, world, steps)
    return {"params": {n: p.detach().clone() for n, p in module.named_parameters()}}


def reference_run(
    steps: int, dtype: str, split: int, linear: str = "dense"
) -> dict[str, torch.Tensor]:
    """One process, the whole batch in ``split`` slices (weights cast to ``dtype`` for
    compute, as FSDP's compute_dtype; fp32 master weights)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ToyLM(linear=linear)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for data in batches(steps):
        opt.zero_grad()
        for part in data.chunk(split):
            cast = {n: p.to(DTYPES[dtype]) for n, p in model.named_parameters()}
            _loss(functional_call(model, cast, (part[:, :-1],)), part).backward()
        for p in model.parameters():
            p.grad.div_(split)
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def shard_layout(rank: int, world: int) -> dict[str, Any]:
    """Which parameters FSDP shards and replicates, and its refusal of a tied weight."""
    model = FSDP(ToyLM())
    tied = ToyLM()
    tied.head.weight = tied.embed.weight
    try:
        FSDP(tied)
        error = ""
    except ValueError as err:
        error = str(err)
    replicated = [k.replace("/", ".") for k in model.replicated]
    return {"sharded": list(model.sharded), "replicated": replicated, "tied_error": error}


def held_bytes(rank: int, world: int) -> dict[str, int]:
    """Bytes of parameters this rank keeps between steps: its shards, the replicated ones,
    and the whole model's sharded parameters for comparison."""
    torch.manual_seed(0)
    module = ToyLM()
    full = sum(p.numel() * 4 for p in module.parameters() if p.dim() >= 2)
    model = FSDP(module)
    sharded = sum(p.numel() * p.element_size() for p in model.shards)
    replicated = sum(p.numel() * p.element_size() for p in model.replicated.values())
    return {"full": full, "sharded": sharded, "replicated": replicated}


def collective_calls(rank: int, world: int) -> dict[str, Any]:
    """Collectives of one training step (validate.probes.comm_count) and whether any full
    weight outlived its module's forward."""
    from validate.probes.comm_count import CollectiveCounter

    torch.set_num_threads(1)
    model = FSDP(ToyLM())
    data = batches(1)[0].chunk(world)[rank]
    with CollectiveCounter() as counter:
        loss = _loss(model(data[:, :-1]), data)
        after_forward = {"live": len(model._live), "attrs": _weights_held(model)}
        loss.backward()
    return {"calls": dict(counter.calls), "after_forward": after_forward}


def _weights_held(model: FSDP) -> int:
    """Full weights still set on the wrapped modules (they should be dropped after forward)."""
    held = [sub.__dict__.get(k) for sub in model.module.modules() for k in ("weight", "bias")]
    return sum(isinstance(t, torch.Tensor) for t in held)
