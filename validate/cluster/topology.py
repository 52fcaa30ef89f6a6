"""Which ranks share a node, and the groups each measurement runs on at once.

A node is what ``torchrun`` calls one (``GROUP_RANK``, its ``--node-rank``), else SLURM's
``SLURM_NODEID``, else the host name: two ``torchrun --nnodes 2`` agents on one machine are
two nodes, as the calibration on CI needs. A *placement* is a set of equal groups that run
the same collective at the same time, every rank in at most one, as a training step's
groups do:

- ``node{g}``: g consecutive ranks of each node (NVLink on a GPU node), every node at once;
- ``cross{n}``: one rank from each of n nodes, for every local rank at once, so that every
  rank's NIC carries its own group's traffic (FSDP or DP over nodes, the planner's
  network groups).

Sizes are the powers of two up to the node's ranks (``node``) and the node count
(``cross``), and the full counts themselves; ``--quick`` keeps the largest of each.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch.distributed as dist

LINK, NETWORK = "link", "network"


def node_label() -> str:
    """This process's node, as the launcher names it (module docstring)."""
    for var in ("GROUP_RANK", "SLURM_NODEID"):
        if os.environ.get(var, "").strip():
            return f"{var.lower()}:{os.environ[var].strip()}"
    return f"host:{socket.gethostname()}"


@dataclass(frozen=True)
class Placement:
    name: str
    link: str
    """``link`` (inside a node) or ``network`` (across nodes)."""
    size: int
    groups: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Topology:
    nodes: tuple[tuple[int, ...], ...]
    """The global ranks of each node, nodes in the order of their first rank."""

    @classmethod
    def from_labels(cls, labels: list[str]) -> Topology:
        """Group ranks by their node labels (rank order kept inside each node)."""
        order: dict[str, list[int]] = {}
        for rank, label in enumerate(labels):
            order.setdefault(label, []).append(rank)
        nodes = tuple(tuple(r) for r in order.values())
        if len({len(n) for n in nodes}) > 1:
            counts = ", ".join(f"{lab}: {len(r)}" for lab, r in order.items())
            raise ValueError(f"every node must run the same number of ranks (got {counts})")
        return cls(nodes)

    @classmethod
    def gather(cls) -> Topology:
        """Every rank's node label, exchanged over the default group."""
        labels: list[str] = [""] * dist.get_world_size()
        dist.all_gather_object(labels, node_label())
        return cls.from_labels(labels)

    @property
    def per_node(self) -> int:
        return len(self.nodes[0])

    @property
    def world(self) -> int:
        return sum(len(n) for n in self.nodes)

    def placements(self, quick: bool = False) -> list[Placement]:
        """Inside-node placements first, then across-node ones (module docstring)."""
        out = [self._inside(g) for g in _sizes(self.per_node, quick)]
        return out + [self._across(n) for n in _sizes(len(self.nodes), quick)]

    def _inside(self, g: int) -> Placement:
        groups = tuple(
            node[i : i + g] for node in self.nodes for i in range(0, len(node) - g + 1, g)
        )
        return Placement(f"node{g}", LINK, g, groups)

    def _across(self, n: int) -> Placement:
        chunks = [self.nodes[i : i + n] for i in range(0, len(self.nodes) - n + 1, n)]
        groups = tuple(
            tuple(node[local] for node in chunk)
            for chunk in chunks
            for local in range(self.per_node)
        )
        return Placement(f"cross{n}", NETWORK, n, groups)


def _sizes(count: int, quick: bool) -> list[int]:
    """Powers of two from 2 up to ``count``, and ``count``; the largest only if ``quick``."""
    if count < 2:
        return []
    sizes = sorted({2**k for k in range(1, count.bit_length()) if 2**k <= count} | {count})
    return sizes[-1:] if quick else sizes


def my_group(placement: Placement, rank: int):
    """Create every group of ``placement`` (each rank must create all, in one order) and
    return this rank's (None where it is in none)."""
    mine = None
    for ranks in placement.groups:
        group = dist.new_group(list(ranks))
        if rank in ranks:
            mine = group
    return mine
