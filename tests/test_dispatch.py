"""Expert-parallel dispatchers (``costmodel.kinds.dispatch``): what an all-to-all sends
over NVLink and over the network per rank, in closed form; DeepEP's one copy per
destination node and rank against exact enumeration of every routing; the kinds in a
sweep; a dispatcher costmodel does not know is refused by name."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy as sp

from costmodel import ParallelSpec, TrainSpec, estimate, get_model, sweep
from costmodel.catalog.hardware import get_hardware
from costmodel.kinds.dispatch import DISPATCHERS, sends_per_token
from costmodel.kinds.routing import HITS, routing_hits
from costmodel.specs.checks import SpecError
from costmodel.specs.parallel import EP_DISPATCHERS, EP_ROUTINGS
from costmodel.symbols import N_ep, d_ep, g_ep, h_nd, h_rk, k_r

H100 = get_hardware("h100-sxm")
MIXTRAL = get_model("mixtral-8x7b")  # D 4096, 8 experts, top-2
TRAIN = TrainSpec(batch=64, seq=4096, grad_accum=1)
NVLINK = H100.link_bandwidth() * H100.eff("link")
NIC = H100.network_bw * H100.eff("network")


def _ep(par: ParallelSpec, model=MIXTRAL, train: TrainSpec = TRAIN) -> dict[str, float]:
    return estimate(model, train, par, H100).values


def _per_a2a(values: dict[str, float], model_layers: int) -> float:
    """Seconds of one all-to-all: forward and backward run 2 each per MoE block and
    micro-batch (no recomputation, one micro-batch)."""
    return values["comm_time_s.ep"] / (4 * model_layers)


def test_inside_a_node_an_all_to_all_runs_at_nvlink_rate():
    """ep 8 in one 8-GPU node: each rank sends (N - 1)/N of its tokens' k copies over
    NVLink at the profile's link efficiency; nothing crosses the network."""
    values = _ep(ParallelSpec(dp=8, ep=8, framework="megatron"))
    tokens = 64 // 8 * 4096
    sent = 2 * tokens * 2 * 4096 * 7 / 8  # bf16, k = 2, D = 4096
    alpha = 7 * H100.link_latency_s  # N - 1 rounds
    assert _per_a2a(values, 32) == pytest.approx(sent / NVLINK + alpha, rel=1e-9)


def test_across_nodes_each_rank_sends_through_its_own_nic():
    """ep 32 over four 8-GPU nodes: every rank of a node sends at once, so each sends the
    (N - g)/N of its pairs bound for other nodes through one NIC (not the node's eight
    together, as a ring's channels would) while (g - 1)/N cross NVLink at the same time."""
    model = get_model("deepseek-moe-16b")  # 64 experts, top-6, D 2048, 28 MoE blocks of 28
    values = _ep(ParallelSpec(dp=32, ep=32, framework="megatron"), model=model)
    tokens = 64 // 32 * 4096
    copies = 2 * tokens * 6 * 2048  # bf16 bytes of every routed pair
    off, on = copies * 24 / 32, copies * 7 / 32
    alpha = 31 * H100.network_latency_s
    blocks = model.n_layers - model.dense_layers
    assert _per_a2a(values, blocks) == pytest.approx(max(off / NIC, on / NVLINK) + alpha)
    assert values["comm_bytes.ep"] == pytest.approx(4 * blocks * (off + on), rel=1e-12)


def _distinct(n: int, g: int, k: int) -> tuple[float, float]:
    """Mean over every routing of k experts' ranks (each of n equally likely) of the
    other nodes and other ranks they hit, seen from rank 0 (nodes of g ranks)."""
    nodes = ranks = 0
    routings = list(itertools.product(range(n), repeat=k))
    for ranks_hit in routings:
        hit = set(ranks_hit)
        nodes += len({r // g for r in hit} - {0})
        ranks += len(hit - {0})
    return nodes / len(routings), ranks / len(routings)


@pytest.mark.parametrize(("n", "g", "k"), [(4, 2, 2), (6, 2, 3), (8, 4, 2), (4, 4, 3)])
def test_deepep_sends_one_copy_per_destination_node_and_rank(n, g, k):
    """Under random routing DeepEP's network copies are the other nodes a token's experts
    hit, its NVLink copies the other ranks they hit (forwarded ones included): exact means
    over every routing equal the closed forms; an all-to-all sends k(N - 1)/N whatever."""
    nodes, ranks = _distinct(n, g, k)
    got = routing_hits("random", 4 * n, k, n, g)
    assert got == pytest.approx((nodes, ranks), rel=1e-12)
    network, nvlink = sends_per_token()
    at = {N_ep: n, g_ep: g, k_r: k, h_nd: got[0], h_rk: got[1]}
    assert float(network.subs({**at, d_ep: 1})) == pytest.approx(nodes, rel=1e-12)
    assert float(nvlink.subs({**at, d_ep: 1})) == pytest.approx(ranks, rel=1e-12)
    pairs = {**at, d_ep: 0}
    assert sp.simplify(network.subs(pairs) + nvlink.subs(pairs) - k * (n - 1) / n) == 0


def _fake_balanced(experts: int, n: int, g: int, k: int) -> tuple[float, float]:
    """NeMo AutoModel's FakeBalancedGate run by hand: every rank's token t takes experts
    (t*k + j) % E, j < k (rank r holding E/n adjacent experts); mean over a whole period of
    tokens and every source rank of the other nodes and ranks a token's experts hit."""
    local = experts // n
    nodes = ranks = count = 0
    for source in range(n):
        for t in range(experts):  # E tokens cover every start
            hit = {(t * k + j) % experts // local for j in range(k)}
            ranks += len(hit - {source})
            nodes += len({r // g for r in hit} - {source // g})
            count += 1
    return nodes / count, ranks / count


@pytest.mark.parametrize(
    ("experts", "n", "g", "k"),
    [(128, 8, 8, 8), (256, 64, 8, 8), (384, 32, 8, 8), (128, 16, 8, 4), (64, 8, 4, 6),
     (60, 4, 2, 4), (32, 8, 8, 4)],
)  # fmt: skip
def test_consecutive_routing_hits_what_automodels_fake_gate_hits(experts, n, g, k):
    """``consecutive`` is AutoModel's benchmark gate: k adjacent experts per token, so on
    one rank where a rank holds a multiple of k of them (Qwen3-30B-A3B at ep 8: 16 each),
    on two adjacent ranks of one node for DeepSeek-V3 at ep 64 (4 each)."""
    assert routing_hits("consecutive", experts, k, n, g) == pytest.approx(
        _fake_balanced(experts, n, g, k), rel=1e-12
    )


def test_adjacent_experts_cut_deepeps_copies_not_an_all_to_alls():
    """Qwen3-30B-A3B's shapes at ep 8 in one node: random routing reaches 7(1 - (7/8)^8)
    = 4.59 other ranks per token, AutoModel's gate 7/8 of one: DeepEP sends 5.2x fewer
    bytes; an all-to-all sends one copy per routed pair either way."""
    model = get_model("qwen3-30b-a3b")
    train = TrainSpec(batch=8, seq=4096, grad_accum=1)
    base = ParallelSpec(fsdp=8, ep=8, framework="fsdp2", ep_dispatcher="deepep")
    spread, adjacent = (
        estimate(model, train, base.replace(ep_routing=r), H100)["comm_bytes.ep"]
        for r in ("random", "consecutive")
    )
    assert spread / adjacent == pytest.approx(7 * (1 - (7 / 8) ** 8) / (7 / 8), rel=1e-12)
    nccl = base.replace(ep_dispatcher="all-to-all")
    sent = [
        estimate(model, train, nccl.replace(ep_routing=r), H100)["comm_bytes.ep"]
        for r in ("random", "consecutive")
    ]
    assert sent[0] == sent[1]
    assert set(HITS) == set(EP_ROUTINGS)  # every routing of the spec has its spread


def test_deepep_sends_fewer_copies_over_the_network_and_finishes_sooner():
    """ep 32 over four nodes, top-6: an all-to-all sends 6 x 24/32 = 4.5 copies of a token
    over the network, DeepEP 3 x (1 - (3/4)^6) = 2.47 (it forwards them over NVLink,
    whose traffic grows but is not the bottleneck)."""
    network, _ = sends_per_token()
    nodes, ranks = routing_hits("random", 64, 6, 32, 8)
    at = {N_ep: 32, g_ep: 8, k_r: 6, h_nd: nodes, h_rk: ranks}
    assert float(network.subs({**at, d_ep: 0})) == pytest.approx(4.5)
    assert float(network.subs({**at, d_ep: 1})) == pytest.approx(3 * (1 - 0.75**6))
    par = ParallelSpec(dp=32, ep=32, framework="megatron")
    model = get_model("deepseek-moe-16b")
    nccl, deepep = (_ep(par.replace(ep_dispatcher=d), model=model)
                    for d in ("all-to-all", "deepep"))  # fmt: skip
    assert deepep["comm_time_s.ep"] < nccl["comm_time_s.ep"] / 1.5
    assert DISPATCHERS["hybridep"].network_efficiency is None  # the profile's rates
    assert tuple(DISPATCHERS) == EP_DISPATCHERS  # every choice of the spec registered


def test_a_dense_model_sends_nothing_and_takes_no_dispatcher():
    """Nothing travels without experts; a dispatcher named for them is refused (issue 60's
    probe: it was accepted and changed nothing)."""
    dense = get_model("llama3-8b")
    values = _ep(ParallelSpec(dp=8, framework="megatron"), model=dense)
    assert values["comm_bytes.ep"] == 0 and values["comm_time_s.ep"] == 0
    for name in set(DISPATCHERS) - {"all-to-all"}:
        with pytest.raises(SpecError, match=r"ep_dispatcher .* needs ep > 1"):
            _ep(ParallelSpec(dp=8, framework="megatron", ep_dispatcher=name), model=dense)


def test_sweep_over_dispatchers_agrees_with_estimate():
    names = np.array(list(DISPATCHERS))
    got = sweep(MIXTRAL, quantities=("comm_time_s.ep",), hardware=H100, dp=16, ep=8,
                framework="megatron", ep_dispatcher=names, batch=64, seq=4096,
                micro_batch=1)  # fmt: skip
    for i, name in enumerate(names):
        par = ParallelSpec(dp=16, ep=8, framework="megatron", ep_dispatcher=str(name))
        want = _ep(par, train=TRAIN.replace(grad_accum=4))["comm_time_s.ep"]
        assert got["comm_time_s.ep"][i] == pytest.approx(want, rel=1e-9)


def test_an_unknown_dispatcher_is_refused_by_name():
    with pytest.raises(SpecError, match=r"ep_dispatcher must be one of all-to-all, deepep"):
        ParallelSpec(ep=8, dp=8, ep_dispatcher="nccl")


def test_a_gpu_dispatcher_on_a_tpu_is_refused_by_name():
    par = ParallelSpec(dp=8, ep=8, framework="megatron", ep_dispatcher="deepep")
    with pytest.raises(SpecError, match="ep_dispatcher deepep runs on NVIDIA GPUs"):
        estimate(MIXTRAL, TRAIN, par, get_hardware("tpu-v5p"))


@pytest.mark.parametrize(
    ("device", "rate"),
    [
        ("h800", 0.75 * 200e9),  # DeepEP's README: 153 GB/s of the H800's 200
        ("h100-sxm", 0.75 * 450e9),  # an H20, the same NVLink 4: 337 GB/s (DeepEP #16)
        ("b200", 0.17 * 900e9),  # a GB200's 169 / 135 GB/s (DeepEP #394)
        ("gb200", 0.17 * 900e9),
    ],
)
def test_deepep_runs_over_nvlink_at_what_was_measured_on_that_generation(device, rate):
    """DeepEP's intranode kernels reach 0.75 of Hopper's one-way NVLink, where the link
    binds them, and stay near Hopper's rates on Blackwell's twice faster NVLink 5: one ep 8
    group in a node sends its copies at the generation's measured share, the other
    dispatchers at the link's efficiency."""
    hw = get_hardware(device)
    assert DISPATCHERS["deepep"].link(hw) == pytest.approx(rate, rel=1e-12)
    for name in ("all-to-all", "hybridep"):
        assert DISPATCHERS[name].link(hw) == pytest.approx(hw.link_bw * hw.eff("link"))
    values = estimate(MIXTRAL, TRAIN, ParallelSpec(dp=8, ep=8, framework="megatron",
                      ep_dispatcher="deepep"), hw).values  # fmt: skip
    copies = routing_hits("random", 8, 2, 8, 8)[1]
    sent = 64 // 8 * 4096 * copies * 4096 * 2  # tokens x copies x D x bf16 bytes
    alpha = 7 * hw.link_latency_s
    assert _per_a2a(values, 32) == pytest.approx(sent / rate + alpha, rel=1e-9)


def test_without_a_measurement_deepep_runs_at_the_links_efficiency():
    """A GPU whose profile states no DeepEP share (AMD's, where Primus-Turbo runs its own
    port) prices DeepEP's NVLink copies at the link's efficiency, as the other kinds."""
    hw = get_hardware("mi355x")
    assert "deepep_link" not in hw.efficiency
    assert DISPATCHERS["deepep"].link(hw) == pytest.approx(hw.link_bw * hw.eff("link"))


def test_a_routing_needs_expert_ranks_and_says_when_it_changes_nothing():
    """Issue 60's fourth probe: ``--ep-routing`` was taken silently on a dense model (where
    ``--ep-dispatcher`` is refused) and changed nothing under the all-to-all dispatcher
    without a word."""
    from costmodel.inputs import build
    from costmodel.specs.parallel import moe_rule

    with pytest.raises(SpecError, match="ep_routing says how a token's experts spread"):
        moe_rule(ParallelSpec(dp=8, ep_routing="consecutive"), get_model("llama3-8b"))
    base = {"model": "qwen3-30b-a3b", "hardware": "h100-sxm", "gpus": 8, "fsdp": 8, "ep": 8,
            "seq": 4096, "batch": 8, "ep_routing": "consecutive"}  # fmt: skip
    said = "--ep-routing consecutive changes nothing under the all-to-all dispatcher"
    assert any(said in n for n in build(base).notes)
    assert not any(said in n for n in build({**base, "ep_dispatcher": "deepep"}).notes)


def _grouped(experts: int, n: int, g: int, k: int, groups: int, chosen: int) -> tuple:
    """Group-limited routing by hand: every choice of ``chosen`` of ``groups`` groups, then
    every k-tuple of the chosen groups' experts, equally likely; mean other nodes and ranks
    hit from every source rank (rank r holds experts r·E/n ...; groups of E/G adjacent)."""
    local, size = experts // n, experts // groups
    nodes = ranks = count = 0
    for picked in itertools.combinations(range(groups), chosen):
        pool = [e for grp in picked for e in range(grp * size, (grp + 1) * size)]
        for routing in itertools.product(pool, repeat=k):
            hit = {e // local for e in routing}
            for source in range(n):
                ranks += len(hit - {source})
                nodes += len({r // g for r in hit} - {source // g})
                count += 1
    return nodes / count, ranks / count


@pytest.mark.parametrize(
    ("experts", "n", "g", "k", "groups", "chosen"),
    [(16, 8, 2, 2, 4, 2), (16, 2, 1, 2, 4, 2), (16, 4, 2, 3, 4, 1), (12, 6, 2, 2, 3, 2),
     (16, 8, 4, 2, 4, 4)],
)  # fmt: skip
def test_group_limited_routing_hits_what_it_limits(experts, n, g, k, groups, chosen):
    """DeepSeek-V3's node-limited routing (a token's experts from 4 of 8 groups): exact
    means over every choice of groups and experts equal ``limited_hits``, whether groups span
    several ranks or a rank holds several groups; every group chosen is random routing."""
    got = routing_hits("random", experts, k, n, g, groups, chosen)
    assert got == pytest.approx(_grouped(experts, n, g, k, groups, chosen), rel=1e-12)


def test_deepseek_v3s_node_limit_cuts_deepeps_network_copies():
    """At ep 64 over eight nodes each group of 32 experts is one node: a token reaches
    3.15 other nodes, not random routing's 4.59; AutoModel's fake gate takes no groups."""
    model = get_model("deepseek-v3")
    assert (model.expert_groups, model.groups_per_token) == (8, 4)
    nodes, _ = routing_hits("random", 256, 8, 64, 8, 8, 4)
    assert nodes == pytest.approx(7 / 8 * 4 * (1 - (3 / 4) ** 8), rel=1e-12)
    assert routing_hits("random", 256, 8, 64, 8)[0] == pytest.approx(7 * (1 - (7 / 8) ** 8))
    assert routing_hits("consecutive", 256, 8, 64, 8, 8, 4) == routing_hits(
        "consecutive", 256, 8, 64, 8
    )
