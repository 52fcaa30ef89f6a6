"""Expert-parallel token dispatchers: what one token's dispatch sends over NVLink and over
the network, and the rates each dispatcher achieves on them (bytes per token, B/s).

An MoE block sends each token to the ranks holding its k routed experts and combines their
outputs back; backward sends the gradients the other way (GShard, Lepikhin et al. 2020,
Sec. 2.2). Every rank sends and receives at once, so unlike a ring's channels the g ranks
of a node do not lend each other their NICs: each sends what leaves its node through its
own NIC (rail-optimized nodes) while what stays in the node crosses NVLink, and the slower
of the two sets the time. With N ranks over N/g nodes and balanced routing (each expert
equally likely), per token:

- ``all-to-all`` (NCCL's ``all_to_all_single`` of the routed pairs: Megatron-Core's
  ``alltoall`` dispatcher, torchtitan's default, DeepSpeed-MoE): one copy per routed pair,
  k·(N - g)/N of them to other nodes and k·(g - 1)/N to the node's other ranks, at the
  hardware's NVLink and network efficiencies;
- ``deepep`` (DeepEP's normal kernels, Zhao et al. 2025; Megatron-Core's ``flex``
  dispatcher, NeMo AutoModel, torchtitan's DeepEP path): one copy per destination node over
  RDMA, then per destination rank over NVLink (a token's experts on one rank or node share
  the copy): over the network the other nodes a token's k experts hit, over NVLink the other
  ranks they hit, forwarded ones included (``costmodel.kinds.routing``: with independent
  experts (N/g - 1)·(1 - (1 - g/N)^k) and (N - 1)·(1 - (1 - 1/N)^k)). Over the network at
  0.86 of a NIC's line rate (DeepEP's README, V1 normal kernels on H800 with 400 Gb/s
  ConnectX-7: 43-58 GB/s of ~50 GB/s, the lowest, EP 16); over NVLink at the share of the
  one-way link its intranode kernels were measured to reach on that device generation
  (``efficiency.deepep_link`` of the hardware profile; the link's own efficiency where none
  was measured). On Hopper they are bound by the link: 153 GB/s of the H800's 200 (its
  README, 158 for combine) and 337 GB/s of an H20's 450 with the default SM budget
  (deepseek-ai/DeepEP issue #16, 2025; the H20 has the H100's NVLink 4), 0.75 of it. On
  Blackwell's NVLink 5 (900 GB/s one way) the same kernels were measured far below the link,
  near Hopper's rates (something other than the link binds them there): 169 GB/s dispatch
  and 135 combine on a GB200 (issue #394, 2025), 116-118 GB/s with the default chunking and
  185-218 tuned on a B200 (torchtitan's grid tuning at EP 4, Qwen3-30B-A3B's shapes;
  scripts/deepep/torchtitan_deepep_tune/TUNING_RESULTS_SUMMARY.md in pytorch/torchtitan
  @018740b), 0.17 of it. DeepEP V2 (2026, NCCL's Gin backend) is faster (643-726 GB/s on
  B200 by its README) and is not this kind;
- ``hybridep`` (NVIDIA's HybridEP, the other backend of Megatron-Core's ``flex``
  dispatcher, built for NVLink domains such as GB200 NVL72): DeepEP's traffic (one copy
  per destination node and rank), at the hardware profile's efficiencies (no published
  measurement of its rates is used).

Combine is the same traffic the other way (DeepEP reduces a node's outputs before sending
them). A group inside one node (g = N) sends nothing over the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodel.specs import checks
from costmodel.specs.hardware import Hardware
from costmodel.specs.parallel import EP_DISPATCHERS
from costmodel.symbols.core import N_ep, d_ep, g_ep, h_nd, h_rk, k_r

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


@dataclass(frozen=True)
class Dispatcher:
    """One dispatcher kind: whether it sends a token once per destination node and rank
    (``dedup``), the hardware profile's efficiency key for its share of the one-way NVLink
    (``link_key``; the profile's ``link`` efficiency where the profile has no such key) and
    its achieved fraction of a NIC's line rate (``None``: the profile's ``network``)."""

    name: str
    dedup: bool
    link_key: str
    network_efficiency: float | None

    def link(self, hw: Hardware) -> float:
        """NVLink B/s per rank on ``hw``: the one-way link at this kind's measured share of
        it on that device, else at the link's efficiency."""
        return hw.link_bandwidth() * hw.efficiency.get(self.link_key, hw.eff("link"))


DISPATCHERS: dict[str, Dispatcher] = {
    "all-to-all": Dispatcher("all-to-all", dedup=False, link_key="link", network_efficiency=None),
    "deepep": Dispatcher("deepep", dedup=True, link_key="deepep_link", network_efficiency=0.86),
    "hybridep": Dispatcher("hybridep", dedup=True, link_key="link", network_efficiency=None),
}


def sends(dedup: Any, k: Any, ranks: Any, per_node: Any, nodes_hit: Any, ranks_hit: Any) -> tuple:
    """(over the network, over NVLink) copies of one token a dispatch sends, for ``ranks``
    of which ``per_node`` share a node, under either kind (``dedup`` 1: one copy per
    destination node and rank, the other nodes and ranks the token's experts hit, by the
    router's spread: ``costmodel.kinds.routing``; 0: one per routed pair, whatever the
    spread). Numbers or sympy expressions alike (training's formula and serving's number)."""
    network = (1 - dedup) * k * (ranks - per_node) / ranks + dedup * nodes_hit
    nvlink = (1 - dedup) * k * (per_node - 1) / ranks + dedup * ranks_hit
    return network, nvlink


def sends_per_token() -> tuple[sp.Expr, sp.Expr]:
    """:func:`sends` over the layout's symbols (``d_ep``, ``k_r``, ``N_ep``, ``g_ep``,
    ``h_nd``, ``h_rk``)."""
    return sends(d_ep, k_r, N_ep, g_ep, h_nd, h_rk)


def dispatch_rates(names: Any, hw: Hardware) -> tuple[Any, Any, Any]:
    """(NVLink B/s, network B/s per rank, dedup flag) under dispatcher ``names`` (a name
    or an array of them, as a sweep holds) on a GPU."""
    if isinstance(names, str):  # one dispatcher (a spec, or a sweep's structure group)
        kind = _checked(names, hw)
        return (kind.link(hw), hw.network_bw * (kind.network_efficiency or hw.eff("network")),
                float(kind.dedup))  # fmt: skip
    names = np.asarray(names)
    link = network = dedup = np.zeros(names.shape)
    seen = np.zeros(names.shape, dtype=bool)
    for kind in DISPATCHERS.values():
        here = names == kind.name
        if not here.any():
            continue
        _checked(kind.name, hw)
        seen |= here
        net_eff = kind.network_efficiency or hw.eff("network")
        link = np.where(here, kind.link(hw), link)
        network = np.where(here, hw.network_bw * net_eff, network)
        dedup = np.where(here, float(kind.dedup), dedup)
    if not seen.all():
        _checked(str(names[~seen].flat[0]), hw)  # raises, naming the unknown dispatcher
    return link, network, dedup


def _checked(name: str, hw: Hardware) -> Dispatcher:
    """The dispatcher ``name``, refused (naming ``ep_dispatcher``) if unknown or, for
    DeepEP's and HybridEP's NVLink-and-RDMA kernels, off a GPU."""
    checks.choice("ep_dispatcher", name, EP_DISPATCHERS)
    if hw.kind != "gpu" and DISPATCHERS[name].dedup:
        why = f"ep_dispatcher {name} runs on NVIDIA GPUs (NVLink and RDMA)"
        raise checks.SpecError("ep_dispatcher", f"{why}; on a {hw.kind} use all-to-all")
    return DISPATCHERS[name]
