"""How a router spreads each token's k experts over the expert-parallel ranks, and so how
many other ranks and nodes a dispatcher that sends one copy per destination (DeepEP) must
reach per token (``costmodel.kinds.dispatch``).

Each kind answers, for E experts over N ranks of which g share a node (rank r holds the
E/N experts r·E/N ... (r + 1)·E/N - 1, Megatron-Core's and NeMo AutoModel's expert
layout), the mean number of *other* nodes and ranks one token's k experts hit, seen from
the token's own rank:

- ``random`` (``ParallelSpec.ep_routing`` default): each of the k experts independent and
  uniform, as a learned router under load balancing spreads them and as Megatron-Core's
  ``--moe-router-force-load-balancing`` draws them (random logits): (N/g - 1)·(1 - (1 -
  g/N)^k) other nodes and (N - 1)·(1 - (1 - 1/N)^k) other ranks (the complement of every
  expert missing a node or rank). Under group-limited routing (``ModelSpec.expert_groups``
  G and ``groups_per_token`` M: DeepSeek-V3's node-limited routing, its 8 groups a node's
  experts each, a token's from at most 4) the k come from the experts of M groups, a
  uniform choice of them (Megatron-Core applies the group limit to the force-balanced
  scores too): fewer ranks and nodes are hit (:func:`limited_hits`);
- ``consecutive``: token t of a rank takes the k experts t·k, ..., t·k + k - 1 (mod E),
  as NeMo AutoModel's ``FakeBalancedGate`` assigns them (``torch.arange(tokens * k)
  .view(-1, k) % E`` in nemo_automodel/components/moe/layers.py; its performance summary
  runs with it: "Fake balanced gate is enabled to simulate ideal expert routing"). The k
  experts are adjacent, so they lie on ceil((s + k)/(E/N)) ranks for a start s within a
  rank (s a multiple of gcd(k, E/N), each equally often), and likewise on nodes of g·E/N
  experts: with E/N a multiple of k, one rank. Every rank sends its token t to the same
  experts, so over a micro-batch each rank is a destination equally often, and a token
  hits its own rank (node) with probability 1/N (g/N) of its hits.

Both are perfectly balanced in expectation: the busiest rank's load is ``ep_imbalance``'s.
An all-to-all sends one copy per routed pair, whatever the spread.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodel.symbols.core import E_r, N_ep, g_ep, h_nd, h_rk, k_r

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def random_hits(
    experts: Any, k: Any, ranks: Any, per_node: Any, groups: Any = 0, chosen: Any = 0
) -> tuple[Any, Any]:
    """(other nodes, other ranks) one token's k independent uniform experts hit, from any
    expert, or under group-limited routing (``groups`` G, ``chosen`` M) from the experts of
    M of the G groups (:func:`limited_hits`)."""
    del experts  # the spread does not depend on how many experts each rank holds
    n, g, k = (np.asarray(x, dtype=float) for x in (ranks, per_node, k))
    free = (n / g - 1) * (1 - (1 - g / n) ** k), (n - 1) * (1 - (1 - 1 / n) ** k)
    on = np.asarray(groups) > 0
    if not on.any():
        return free

    def one(kk: int, nn: int, gg: int, big: int, m: int) -> tuple[float, float]:
        return (limited_hits(nn // gg, kk, big, m) * (1 - gg / nn),
                limited_hits(nn, kk, big, m) * (1 - 1 / nn))  # fmt: skip

    nodes, ranks_hit = per_unique(one, k, n, g, groups, chosen)
    return np.where(on, nodes, free[0]), np.where(on, ranks_hit, free[1])


def per_unique(fn: Any, *columns: Any) -> tuple[np.ndarray, np.ndarray]:
    """``fn``'s two results over integer ``columns`` (broadcast together), computed once
    per distinct row: a plan's millions of layouts hold a few (ranks, ranks per node)."""
    cols = np.broadcast_arrays(*(np.asarray(c).astype(np.int64) for c in columns))
    shape = cols[0].shape
    table, back = np.unique(np.stack([c.ravel() for c in cols], axis=1), axis=0,
                            return_inverse=True)  # fmt: skip
    done = np.array([fn(*map(int, row)) for row in table], dtype=float).reshape(-1, 2)
    back = back.reshape(-1)
    return done[back, 0].reshape(shape), done[back, 1].reshape(shape)


def limited_hits(units: int, k: int, groups: int, chosen: int) -> float:
    """Mean units (ranks or nodes, each an equal run of adjacent experts) one token's k
    experts hit when they come uniformly from ``chosen`` (M) of ``groups`` (G) equal groups
    of adjacent experts, the groups a uniform choice (node-limited routing under balanced
    scores). Where the groups divide the U units, a unit is hit when its group is chosen
    (M/G) and an expert falls in its G/(U·M) share of the chosen experts; where the units
    divide the groups, a unit holding c of the chosen groups (hypergeometric) is hit with
    1 - (1 - c/M)^k. Groups and units that do not nest are taken as unlimited, as every
    group chosen is: U·(1 - (1 - 1/U)^k)."""
    units, k, groups, chosen = int(units), int(k), int(groups), int(chosen)
    free = units * (1 - (1 - 1 / units) ** k)
    if not groups or chosen >= groups:
        return free
    if units % groups == 0:
        share = groups / (units * chosen)
        return units * chosen / groups * (1 - (1 - share) ** k)
    if groups % units:
        return free
    held = groups // units  # groups a unit holds, of which c are chosen
    missed = sum(
        math.comb(held, c) * math.comb(groups - held, chosen - c) / math.comb(groups, chosen)
        * (1 - c / chosen) ** k
        for c in range(max(0, chosen - groups + held), min(held, chosen) + 1)
    )  # fmt: skip
    return units * (1 - missed)


def _span(k: int, size: int, groups: int) -> float:
    """Mean groups of ``size`` adjacent experts that k adjacent experts cover, their start
    a multiple of gcd(k, size) within a group, each equally often; at most ``groups``."""
    step = math.gcd(k, size)
    starts = range(0, size, step)
    return sum(min(groups, -(-(s + k) // size)) for s in starts) / len(starts)


def consecutive_hits(
    experts: Any, k: Any, ranks: Any, per_node: Any, groups: Any = 0, chosen: Any = 0
) -> tuple[Any, Any]:
    """(other nodes, other ranks) one token's k consecutive experts hit (``FakeBalancedGate``,
    which takes no groups: ``groups`` and ``chosen`` are ignored)."""
    del groups, chosen

    def one(e: int, kk: int, n: int, g: int) -> tuple[float, float]:
        local = e // n
        rank_span = _span(kk, local, n)
        node_span = _span(kk, local * g, n // g)
        return node_span * (1 - g / n), rank_span * (1 - 1 / n)

    return per_unique(one, experts, k, ranks, per_node)


HITS = {"random": random_hits, "consecutive": consecutive_hits}
"""Routing kind -> (other nodes, other ranks) per token; every kind of
``ParallelSpec.ep_routing``."""


def routing_hits(
    routing: Any, experts: Any, k: Any, ranks: Any, per_node: Any, groups: Any = 0,
    chosen: Any = 0,
) -> tuple[Any, Any]:  # fmt: skip
    """(other nodes, other ranks) per token under ``routing`` (a name or an array of names,
    as a sweep holds), random routing limited to ``chosen`` of ``groups`` expert groups
    where the model has them; 0 and 0 for a dense model (no experts) or a single rank."""
    names = np.asarray(routing)
    moe = (np.asarray(experts) > 0) & (np.asarray(ranks) > 1)
    safe = [np.where(moe, x, 2) for x in (experts, k, ranks)]
    per_node = np.where(moe, per_node, 1)
    limits = [np.where(moe, x, 0) for x in (groups, chosen)]
    nodes = ranks_hit = np.zeros(np.broadcast(names, *safe, per_node).shape)
    for name, hits in HITS.items():
        here = names == name
        if here.any():
            got = hits(*safe, per_node, *limits)
            nodes = np.where(here, got[0], nodes)
            ranks_hit = np.where(here, got[1], ranks_hit)
    nodes, ranks_hit = np.where(moe, nodes, 0.0), np.where(moe, ranks_hit, 0.0)
    if nodes.ndim == 0:
        return float(nodes), float(ranks_hit)
    return nodes, ranks_hit


def routing_values(model: Any, par: Any, values: dict[sp.Symbol, Any]) -> dict[sp.Symbol, Any]:
    """``h_nd`` and ``h_rk`` of a layout from its routing, the model's expert groups and the
    experts, ranks and ranks per node ``values`` already holds (0 without a layout)."""
    if par is None:
        return {h_nd: 0.0, h_rk: 0.0}
    limits = getattr(model, "expert_groups", 0), getattr(model, "groups_per_token", 0)
    nodes, ranks = routing_hits(getattr(par, "ep_routing", "random"), values[E_r],
                                values[k_r], values[N_ep], values[g_ep], *limits)  # fmt: skip
    return {h_nd: nodes, h_rk: ranks}
