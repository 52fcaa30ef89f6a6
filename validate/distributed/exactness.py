"""Why data parallelism cannot equal one process on the unsplit batch bit for bit (issue 60).

The issue's setting: an embedding 100 x 64, an RMSNorm, a linear 64 -> 128, ReLU, an
RMSNorm, a linear 128 -> 64 and a head 64 -> 100; 20 sequences of 8 tokens split 10 / 10
over two gloo ranks; cross-entropy on the last position; SGD at lr 0.01; fp32,
``torch.use_deterministic_algorithms(True)``. After one step the hand-written FSDP, the
naive DDP and torch's ``DistributedDataParallel`` hold the same parameters bit for bit,
and so does one process that takes each rank's half, sums the two mean-loss gradients in
rank order and halves them. One process on the unsplit batch differs from all of them
alike (by up to 7.45e-9 in a weight, 5.8e-11 in a bias): its weight gradient is one matmul
whose reduction runs over all 20 rows in the kernel's own order, where any data-parallel
run forms the two halves' partial sums and adds them. Floating-point addition is not
associative, so no order of the ranks' reduction reproduces a sum it never forms; the halving
itself is exact (a power of two).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from validate.distributed.ddp import NaiveDDP
from validate.distributed.fsdp_checks import Norm
from validate.fsdp import FSDP

LR, ROWS, SEQ, VOCAB = 0.01, 20, 8, 100


def model() -> nn.Module:
    """The issue's toy model, seeded."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 64), Norm(64), nn.Linear(64, 128), nn.ReLU(),
                         Norm(128), nn.Linear(128, 64), nn.Linear(64, VOCAB))  # fmt: skip


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (ROWS, SEQ), generator=g), torch.randint(
        0, VOCAB, (ROWS,), generator=g
    )


def _loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(x)[:, -1], y)


def _params(m: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def one_process(split: int) -> dict[str, torch.Tensor]:
    """One SGD step in one process: on the whole batch (``split`` 1), or on ``split`` equal
    parts whose mean-loss gradients are summed in order and divided by ``split``."""
    m, (x, y) = model(), data()
    rows = ROWS // split
    grads = []
    for r in range(split):
        m.zero_grad()
        _loss(m, x[r * rows : (r + 1) * rows], y[r * rows : (r + 1) * rows]).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for n, p in m.named_parameters():
        p.grad = sum(g[n] for g in grads[1:]).add(grads[0][n]) if split > 1 else grads[0][n]
        p.grad.div_(split)
    torch.optim.SGD(m.parameters(), lr=LR).step()
    return _params(m)


def rank_run(rank: int, world: int) -> dict[str, Any]:
    """This rank's parameters after one step under each wrapper; rank 0 adds the
    one-process runs."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    x, y = data()
    rows = ROWS // world
    x, y = x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
    out: dict[str, Any] = {}
    for kind in ("fsdp", "naive-ddp", "torch-ddp"):
        m = model()
        wrapped = {"fsdp": FSDP, "naive-ddp": NaiveDDP,
                   "torch-ddp": nn.parallel.DistributedDataParallel}[kind](m)  # fmt: skip
        opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
        _loss(wrapped, x, y).backward()
        if kind != "torch-ddp":
            wrapped.finish_gradient_synchronization()
        opt.step()
        out[kind] = wrapped.gather_full_params() if kind == "fsdp" else _params(m)
        dist.barrier()
    if rank == 0:
        out["split"], out["unsplit"] = one_process(world), one_process(1)
    return out
