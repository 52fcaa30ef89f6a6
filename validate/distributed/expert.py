"""Expert parallelism by hand: each rank of an ep group holds ``n_experts / ep`` of every
MoE block's routed experts, and tokens travel to them and back by all-to-all.

As GShard (Lepikhin et al. 2020, Sec. 2.2) and torchtitan's and Megatron-LM's token
dispatchers run it: every rank routes its own tokens (router, top-k, renormalised
weights, shared experts, as ``validate.reference.moe.MoE``), orders its routed
token-expert pairs by expert, tells each rank how many pairs it will get for each of its
experts (an all-to-all of counts), sends the pairs' inputs (all-to-all, in the compute
dtype), runs its experts on what it received, sends the outputs back (all-to-all) and
adds them, weighted, to its tokens. Backward sends the gradients the other way. Each of
a rank's experts runs once, on its rows from every source concatenated (what a step
keeps per routed pair is the reference MoE's: the concatenations keep nothing).

``routing``: ``topk`` (the router's choice); ``balanced`` replaces top-k by a fixed round
robin (token i's j-th expert is (i·k + j) mod E, its weight gathered from the same
probabilities): every rank sends and receives the same number of pairs, the case
costmodel's all-to-all volume describes exactly (``ep_imbalance`` 1); ``one-rank`` the
same round robin over the first rank's experts only (every pair to rank 0:
``ep_imbalance`` = ep). The gather keeps the same int64 indices top-k keeps.

``capacity`` (0: dropless) drops, on each source rank, an expert's pairs past
ceil(capacity · tokens · k / E) in token order before dispatch (Megatron-LM's
``--moe-expert-capacity-factor`` with the position drop policy): the dropped pairs add
nothing to their tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from validate.reference.moe import MoE

SENT: dict[str, int] = {"bytes": 0, "calls": 0}
"""Bytes of token rows this process has sent to other ranks in all-to-alls, and the
all-to-alls (the counts' exchange, E int64 per block and pass, is not counted)."""
ROUTED: dict[str, int] = {"own": 0, "received": 0}
"""Routed token-expert pairs this process's tokens made and its experts received (every
forward pass, itself included; dropped pairs are not received)."""
ROUTINGS = ("balanced", "topk", "one-rank")


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    """Rows ``x`` split by ``send`` to each rank; returns the rows received, split by
    ``recv``, in rank order."""
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    me = dist.get_rank(group)
    row = x[0].numel() * x.element_size() if x.shape[0] else 0
    SENT["bytes"] += (sum(send) - send[me]) * row
    SENT["calls"] += 1
    return out


class AllToAll(torch.autograd.Function):
    """Differentiable all-to-all of rows: backward sends the gradients back the way the
    rows came (counted in ``SENT`` both ways)."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group: Any):  # type: ignore[override]
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _exchange(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def balanced_choice(tokens: int, k: int, experts: int, device: torch.device) -> torch.Tensor:
    """(tokens, k) expert ids: token i's j-th expert is (i·k + j) mod E (k <= E distinct
    per token; each expert gets tokens·k/E pairs where E divides tokens·k)."""
    ids = torch.arange(tokens, device=device)[:, None] * k + torch.arange(k, device=device)
    return ids % experts


def within_capacity(chosen: torch.Tensor, experts: int, capacity: float) -> torch.Tensor:
    """Positions of the flattened (token, slot) pairs an expert keeps: the first
    ceil(capacity · pairs / E) of each expert's, in token order; all of them at 0."""
    flat = chosen.reshape(-1)
    if not capacity:
        return torch.arange(flat.numel(), device=flat.device)
    limit = math.ceil(capacity * flat.numel() / experts)
    onehot = torch.nn.functional.one_hot(flat, experts)
    place = (onehot.cumsum(0) * onehot).sum(1)  # 1-based place within its expert's pairs
    return (place <= limit).nonzero().flatten()


class ExpertParallelMoE(nn.Module):
    """An MoE block's FFN with this rank's share of its routed experts (module docstring)."""

    def __init__(
        self, moe: MoE, group: Any = None, routing: str = "topk", capacity: float = 0.0
    ) -> None:
        super().__init__()
        self.group = group or dist.group.WORLD
        ep, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        total = len(moe.experts)
        if total % ep:
            raise ValueError(f"ep must divide n_experts (got ep={ep}, n_experts={total})")
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)} (got {routing!r})")
        self.total, self.local, self.routing, self.capacity = total, total // ep, routing, capacity
        self.k, self.router, self.shared = moe.k, moe.router, moe.shared
        mine = range(rank * self.local, (rank + 1) * self.local)
        self.experts = nn.ModuleList(moe.experts[i] for i in mine)

    def _route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights renormalised over each token's k experts, (tokens, k) expert ids)."""
        probs = torch.softmax(self.router(flat).float(), dim=-1)
        if self.routing == "topk":
            weights, chosen = probs.topk(self.k, dim=-1)
        else:
            over = self.total if self.routing == "balanced" else self.local
            chosen = balanced_choice(flat.shape[0], self.k, over, flat.device)
            weights = probs.gather(1, chosen)
        return (weights / weights.sum(-1, keepdim=True)).to(flat.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self._route(flat)
        out = self.shared(flat) if self.shared is not None else torch.zeros_like(flat)
        kept = within_capacity(chosen, self.total, self.capacity)
        experts_of = chosen.reshape(-1)[kept]
        order = kept[experts_of.argsort(stable=True)]  # kept pairs by expert, so by rank
        token, slot = order // self.k, order % self.k
        per_expert = torch.bincount(experts_of, minlength=self.total)
        incoming = torch.empty_like(per_expert)  # [source rank, my expert] pair counts
        dist.all_to_all_single(incoming, per_expert, group=self.group)
        ep = self.total // self.local
        send = per_expert.view(ep, self.local).sum(1).tolist()
        counts = incoming.view(ep, self.local).tolist()
        recv = [sum(row) for row in counts]
        ROUTED["own"] += chosen.numel()
        ROUTED["received"] += sum(recv)
        inbound = AllToAll.apply(flat[token], send, recv, self.group)
        # inbound holds each source's rows ordered by my experts: each expert runs once
        # on its rows from every source (one weight cast each, as the reference's), and
        # the outputs go back in the order the rows came
        pieces = list(inbound.split([n for row in counts for n in row]))
        mine = [torch.cat(pieces[e :: self.local]) for e in range(self.local)]
        outs = [expert(rows) for expert, rows in zip(self.experts, mine, strict=True)]
        per_source = [out.split([row[e] for row in counts]) for e, out in enumerate(outs)]
        ordered = [per_source[e][src] for src in range(ep) for e in range(self.local)]
        back = AllToAll.apply(torch.cat(ordered), recv, send, self.group)
        return out.index_add(0, token, back * weights[token, slot, None]).view_as(x)


def expert_parallel(
    model: nn.Module, group: Any = None, routing: str = "topk", capacity: float = 0.0
) -> list[str]:
    """Replace every MoE FFN of the reference ``model`` by this rank's
    :class:`ExpertParallelMoE` (the other ranks' experts are dropped); returns the names of
    the routed experts' parameters, which data parallelism must leave alone (each rank's
    are different experts)."""
    for block in getattr(model, "blocks", []):
        if isinstance(block.ffn, MoE):
            block.ffn = ExpertParallelMoE(block.ffn, group, routing, capacity)
    return [name for name, _ in model.named_parameters() if ".ffn.experts." in name]


def model_check(rank: int, world: int, spec: Any, precision: str = "fp32") -> dict[str, float]:
    """The reference MoE model under expert parallelism (top-k routing, each rank on its
    share of the batch) against the same model on the whole batch in this process: the
    loss (the ranks' means, averaged) and every parameter's gradient (dense ones averaged
    over the ranks, a routed expert's from the rank holding it, over the ranks); the
    largest absolute differences."""
    from costmodel import TrainSpec
    from validate.reference.model import TransformerLM, make_batch

    train = TrainSpec(batch=2 * world, seq=16, precision=precision, elementwise="eager")
    torch.manual_seed(0)
    whole = TransformerLM.for_training(spec, train)
    torch.manual_seed(0)
    model = TransformerLM.for_training(spec, train)
    experts = set(expert_parallel(model))
    data = make_batch(whole, train.batch, train.seq, generator=torch.Generator().manual_seed(1))
    ref = whole(data)
    ref.backward()
    loss = model(tuple(d.chunk(world)[rank] for d in data))
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = dict(whole.named_parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        if name not in experts:
            dist.all_reduce(p.grad)
        worst = max(worst, float((p.grad / world - grads[_global(name, rank, spec)].grad)
                                 .abs().max()))  # fmt: skip
    return {"loss": abs(float(total) / world - float(ref.detach())), "grads": worst}


def _global(name: str, rank: int, spec: Any) -> str:
    """The whole model's name of this rank's parameter (its experts are numbered from 0)."""
    if ".ffn.experts." not in name:
        return name
    head, rest = name.split(".ffn.experts.", 1)
    local, tail = rest.split(".", 1)
    per_rank = spec.n_experts // dist.get_world_size()
    return f"{head}.ffn.experts.{rank * per_rank + int(local)}.{tail}"
