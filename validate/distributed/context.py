"""Context parallelism by hand: ring attention over K/V chunks, and the reference model
with each rank holding one contiguous chunk of every sequence.

Ring attention (Liu et al. 2023) as torch's experimental ``context_parallel`` runs it
(``_templated_ring_attention`` and its backward, torch 2.13): forward passes each K/V
chunk round the ring (N - 1 sends per rank) and merges the partial outputs by their
log-sum-exp; backward passes K/V round again (N - 1 sends) and, with them, fp32
accumulators of their gradients, which travel N hops to come home. Causal attention
with contiguous chunks: rank r's queries see chunks 0..r (the diagonal one causally), so
the later ranks compute more (torch balances this by giving each rank two chunks; the
bytes sent are the same). Blocks run through torch's fused flash kernel on CPU, as
torch's context_parallel runs them; on other devices through a math path (fp32 scores
materialised per block). Backward keeps a fused kernel's Q, K, V, O and log-sum-exp.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from costmodel import TrainSpec
from validate.distributed.checks import small_spec
from validate.reference.model import (
    _CPU_FLASH,
    _CPU_FLASH_BWD,
    TransformerLM,
    make_batch,
    rope_tables,
)

SENT: dict[str, int] = {"bytes": 0, "sends": 0}
"""Bytes and point-to-point sends this process has made in ring attention."""


def _exchange(tensors: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Send ``tensors`` to the next rank of the ring and receive as many from the previous."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nxt = dist.get_global_rank(group, (rank + 1) % world)
    prev = dist.get_global_rank(group, (rank - 1) % world)
    out = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, o, prev, group) for o in out]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    SENT["bytes"] += sum(t.numel() * t.element_size() for t in tensors)
    SENT["sends"] += len(tensors)
    return out


def _scores(q: torch.Tensor, k: torch.Tensor, diagonal: bool, causal: bool) -> torch.Tensor:
    """fp32 scaled scores of one block (the math path), K's heads repeated for grouped
    queries; the diagonal block of a causal ring masked above its diagonal."""
    k = _repeat(k, q.shape[1]).float()
    s = (q.float() @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal and diagonal:
        t = s.shape[-1]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return s


def _repeat(x: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V with each head repeated for its group of query heads."""
    groups = heads // x.shape[1]
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def _heads(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Sum a per-query-head gradient over each K/V head's group."""
    b, h, t, d = x.shape
    return x.view(b, kv_heads, h // kv_heads, t, d).sum(2) if h != kv_heads else x


def block_forward(q, k, v, causal: bool, fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(s) V, logsumexp(s)) of one block: on CPU torch's fused flash kernel (what
    torch's context_parallel calls per block), elsewhere in fp32 with the scores
    materialised (b x heads x T/N x T/N)."""
    h = q.shape[1]
    if fused:
        return _CPU_FLASH(q, _repeat(k, h), _repeat(v, h), 0.0, causal)
    s = _scores(q, k, True, causal)
    lse = s.logsumexp(-1)
    return torch.exp(s - lse[..., None]) @ _repeat(v, h).float(), lse


def block_backward(dout, q, k, v, o, lse, causal: bool, fused: bool) -> tuple[torch.Tensor, ...]:
    """One block's (dq, dk, dv) given the whole attention's output and log-sum-exp (the
    flash backward's recomputation; Dao 2023, Alg. 2), K/V heads summed over groups."""
    h, kv = q.shape[1], k.shape[1]
    if fused:
        dq, dk, dv = _CPU_FLASH_BWD(dout, q, _repeat(k, h), _repeat(v, h), o, lse, 0.0, causal)
        return dq, _heads(dk, kv), _heads(dv, kv)
    dout = dout.float()
    p = torch.exp(_scores(q, k, True, causal) - lse[..., None])
    delta = (dout * o.float()).sum(-1)
    ds = p * (dout @ _repeat(v, h).float().transpose(-2, -1) - delta[..., None])
    ds = ds * (1.0 / math.sqrt(q.shape[-1]))
    dk = _heads(ds.transpose(-2, -1) @ q.float(), kv)
    return ds @ _repeat(k, h).float(), dk, _heads(p.transpose(-2, -1) @ dout, kv)


class RingAttention(torch.autograd.Function):
    """softmax(QKᵀ/√d) V over the whole sequence from each rank's chunk of Q, K, V
    (b, heads, T/N, d), chunks in rank order along the sequence; ``fused``: the blocks'
    kernel (None: the fused one on CPU, the math path elsewhere)."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, group: Any, fused: bool | None = None):  # type: ignore[override]
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        fused = q.device.type == "cpu" if fused is None else fused
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
        kv = [k.contiguous(), v.contiguous()]
        for i in range(world):
            src = (rank - i) % world
            nxt = _exchange(kv, group) if i != world - 1 else kv
            if not causal or src <= rank:
                block, block_lse = block_forward(q, *kv, causal and src == rank, fused)
                new = torch.logaddexp(lse, block_lse)
                old_w, new_w = torch.exp(lse - new), torch.exp(block_lse - new)
                out, lse = out * old_w[..., None] + block * new_w[..., None], new
            kv = nxt
        # laid out (b, T, heads, d) as fused kernels write it: the out-projection's
        # (b, T, heads·d) input is then a view, not a copy
        b, h, t, d = q.shape
        o = q.new_empty((b, t, h, d)).transpose(1, 2).copy_(out)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.group, ctx.fused = causal, group, fused
        return o

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, o, lse = ctx.saved_tensors
        group, causal, fused = ctx.group, ctx.causal, ctx.fused
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = [k.contiguous(), v.contiguous()]
        grads: list[torch.Tensor] = []
        for i in range(world):
            src = (rank - i) % world
            nxt = _exchange(kv, group) if i != world - 1 else kv
            dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
            dv = torch.zeros_like(dk)
            if not causal or src <= rank:
                diagonal = causal and src == rank
                dq_, dk_, dv_ = block_backward(dout, q, *kv, o, lse, diagonal, fused)
                dq += dq_
                dk, dv = dk + dk_, dv + dv_
            if grads:  # the accumulators of chunk src, from the ranks before this one
                dk, dv = grads[0] + dk, grads[1] + dv
            grads = _exchange([dk, dv], group)
            kv = nxt
        return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), None, None, None


class RingCore(nn.Module):
    """Drop-in for the reference model's attention core (``Attention.core``)."""

    def __init__(self, group: Any = None, causal: bool = True) -> None:
        super().__init__()
        self.group, self.causal, self.dropout = group, causal, 0.0

    def forward(self, q, k, v, mask):
        return RingAttention.apply(q, k, v, self.causal, self.group or dist.group.WORLD)


class ContextParallelLM(nn.Module):
    """The reference model on one rank's chunk of each sequence: ring attention in every
    block, RoPE at the chunk's positions; ``forward((ids, targets))`` the mean
    cross-entropy over the chunk's tokens (equal chunks: the mean of the ranks' means
    is the whole batch's)."""

    def __init__(self, model: TransformerLM, group: Any = None) -> None:
        super().__init__()
        if model.spec.pos != "rope" or model.attention != "flash":
            raise ValueError("context parallelism here needs RoPE and attention='flash'")
        self.model, self.group = model, group or dist.group.WORLD
        for block in model.blocks:
            block.attn.core = RingCore(self.group)

    def forward(self, batch) -> torch.Tensor:
        ids, targets = batch
        m, t = self.model, ids.shape[1]
        start = dist.get_rank(self.group) * t
        cos, sin = rope_tables(t, m.spec.head_dim, m.compute, ids.device, start=start)
        x = m._run_blocks(m._embed(ids), cos, sin, None)
        logits = m.lm_head(m.norm_f(x).to(m.compute))
        return F.cross_entropy(logits.float().view(-1, m.spec.vocab), targets.view(-1))


def local_chunk(data: tuple[torch.Tensor, ...], rank: int, world: int) -> tuple:
    """This rank's contiguous chunk of every sequence in ``data`` (b, T) tensors."""
    return tuple(d.chunk(world, dim=1)[rank].contiguous() for d in data)


def ring_check(
    rank: int, world: int, causal: bool, fused: bool, kv_heads: int = 2
) -> dict[str, float]:
    """Ring attention on this rank's chunk against attention over the whole sequence
    (SDPA, fp32, same inputs on every rank): the largest absolute differences of the
    output and of the Q, K and V gradients of this rank's chunk."""
    g = torch.Generator().manual_seed(0)
    b, h, t, d = 2, 4, 16 * world, 8
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n in (h, kv_heads, kv_heads))
    dout = torch.randn(b, h, t, d, generator=g)
    full = [z.clone().requires_grad_() for z in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=causal, enable_gqa=kv_heads != h)
    ref.backward(dout)
    local = [z.chunk(world, dim=2)[rank].clone().requires_grad_() for z in (q, k, v)]
    out = RingAttention.apply(*local, causal, dist.group.WORLD, fused)
    out.backward(dout.chunk(world, dim=2)[rank])
    mine = lambda x: x.chunk(world, dim=2)[rank]  # noqa: E731
    diffs = {"out": (out - mine(ref)).detach().abs().max()}
    for name, a, r in zip(("dq", "dk", "dv"), local, full, strict=True):
        diffs[name] = (a.grad - mine(r.grad)).abs().max()
    return {k: float(x) for k, x in diffs.items()}


def model_check(rank: int, world: int, precision: str = "fp32") -> dict[str, float]:
    """The reference model under context parallelism against the same model on the whole
    sequences in this process: the loss (the mean of the ranks' chunk losses) and every
    parameter's gradient (averaged over the ranks); the largest absolute differences."""
    train = TrainSpec(batch=2, seq=16 * world, precision=precision, elementwise="eager")
    spec = small_spec()
    torch.manual_seed(0)
    whole = TransformerLM.for_training(spec, train)
    torch.manual_seed(0)
    cp = ContextParallelLM(TransformerLM.for_training(spec, train))
    data = make_batch(whole, train.batch, train.seq, generator=torch.Generator().manual_seed(1))
    ref = whole(data)
    ref.backward()
    loss = cp(local_chunk(data, rank, world))
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)  # the chunks' means, summed
    worst = 0.0
    for p, q in zip(cp.model.parameters(), whole.parameters(), strict=True):
        dist.all_reduce(p.grad)
        worst = max(worst, float((p.grad / world - q.grad).abs().max()))
    return {"loss": abs(float(total) / world - float(ref.detach())), "grads": worst}
