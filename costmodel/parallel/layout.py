"""Numbers for the parallel and hardware symbols: degrees, and each group's link.

Placement order (innermost first): tp, cp, fsdp, dp, pp (Megatron-LM). On GPUs a group
whose span fits in ``devices_per_node`` uses the one-way NVLink bandwidth (ring
collectives run at it; NCCL's bus bandwidth), otherwise the network share of the NICs its
members in one node drive together, at most NVLink's.
Expert-parallel groups are etp x ep ranks of the expert layers' own mesh (Megatron's MoE
parallel folding; torchtitan's ep within dp_shard): an ep group's ranks are etp devices
apart, and its dispatcher (``costmodel.kinds.dispatch``) says what crosses NVLink and
what the network. On
TPUs every group is on ICI: a link's bidirectional bandwidth per mesh axis, times the axes
given to it (Scaling Book: W = 2·9e10 per axis on v5p, times M_X or M_Y).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from costmodel.kinds.dispatch import dispatch_rates
from costmodel.single.fp8 import check_device, gemm_rate
from costmodel.single.precision import PRECISIONS
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import TrainSpec
from costmodel.specs.parallel import ParallelSpec, device_count
from costmodel.symbols.core import (
    W_X,
    W_Y,
    C,
    C_attn,
    C_attn_b,
    C_eff,
    N_cp,
    N_dp,
    N_ep,
    N_etp,
    N_pp,
    N_sm,
    R_alloc,
    S_bucket,
    W_cp,
    W_dp,
    W_ep,
    W_epn,
    W_hbm,
    W_pp,
    X,
    Y,
    a_cp,
    a_dp,
    a_ep,
    a_pp,
    a_X,
    a_Y,
    c_cap,
    c_pad,
    d_ep,
    eta_ov,
    g_ep,
    g_full,
    g_part,
    k_half,
    l_ex,
    m,
    r_grp,
    rho_ep,
    s_sync,
    t_ex,
    t_m,
    t_n,
    t_op,
    v,
)

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

_ORDER = ("tp", "cp", "fsdp", "dp", "pp")
_SYMBOLS = {
    "tp": (W_Y, a_Y),
    "cp": (W_cp, a_cp),
    "fsdp": (W_X, a_X),
    "dp": (W_dp, a_dp),
    "pp": (W_pp, a_pp),
}


def _where(cond: Any, a: float, b: float) -> Any:
    """``a if cond else b`` for a bool or elementwise for an array of them."""
    return np.where(cond, a, b) if isinstance(cond, np.ndarray) else (a if cond else b)


def group_links(par: ParallelSpec, hw: Hardware) -> dict[str, tuple[Any, Any]]:
    """Group -> (bandwidth bytes/s, latency s) per device. Degrees may be numpy arrays
    (a sweep over layouts); the links are then arrays too."""
    degrees = {"tp": par.tp, "cp": par.cp, "fsdp": par.fsdp, "dp": par.dp, "pp": par.pp}
    links: dict[str, tuple[Any, Any]] = {}
    stride: Any = 1
    for name in _ORDER:
        links[name] = _link(name, stride, degrees[name], par, hw)
        stride = stride * degrees[name]
    return links


def off_tpu(par: Any, hw: Hardware) -> None:
    """Refuse the TPU-only layout fields on another device: slices (joined over DCN) and
    the ICI mesh axes a group uses (``mx``, ``my``); a GPU's groups are placed by
    ``devices_per_node``."""
    if np.any(np.asarray(getattr(par, "slices", 1)) > 1):
        raise SpecError("slices", f"slices > 1 joins TPU slices over DCN; a {hw.kind}'s "
                        f"nodes are its devices_per_node ({hw.devices_per_node})")  # fmt: skip
    for axis in ("mx", "my"):
        if np.any(np.asarray(getattr(par, axis, 1)) > 1):
            raise SpecError(axis, f"{axis} > 1 gives a group more of a TPU's ICI mesh axes; "
                            f"a {hw.kind} has none (its {hw.intranode_link()} joins "
                            f"{hw.devices_per_node} devices)")  # fmt: skip


def members_per_node(stride: Any, degree: Any, devices_per_node: int) -> Any:
    """Members of a group of ``degree`` ranks ``stride`` devices apart that share a node
    (at least 1, at most the degree); ints or numpy arrays."""
    return np.clip(devices_per_node // np.asarray(stride), 1, degree)


def _link(name: str, stride: Any, degree: Any, par: ParallelSpec, hw: Hardware) -> tuple:
    """(bandwidth, latency) of a group of ``degree`` ranks ``stride`` devices apart.

    Inside a node: NVLink. Across nodes NCCL runs one ring (or tree) channel per NIC, each
    crossing every node once, so the g members a node holds send through g NICs at once
    and the group's per-rank bandwidth is min(NVLink, g x the device's network share)
    (rail-optimized nodes, a NIC per GPU: DGX A100/H100; nccl-tests' inter-node bus
    bandwidth is the node's NICs together). The node's other groups use its other NICs at
    the same time, so a group with one member per node (dp after tp 8) gets one NIC.
    """
    if hw.kind == "tpu":
        return _tpu_link(name, stride, degree, par, hw)
    off_tpu(par, hw)
    inside = stride * degree <= hw.devices_per_node
    link = hw.link_bandwidth() * hw.eff("link")
    g = members_per_node(stride, degree, hw.devices_per_node)
    network = np.minimum(link, g * hw.network_bw * hw.eff("network"))
    return (
        _scalar(_where(inside, link, network)),
        _where(inside, hw.link_latency_s, hw.network_latency_s),
    )


def _tpu_link(name: str, stride: Any, degree: Any, par: ParallelSpec, hw: Hardware) -> tuple:
    """(bandwidth, latency) of a TPU group: inside a slice, a link's bidirectional ICI
    bandwidth per mesh axis given to it (Scaling Book, ch. 3: W = 2 x 9e10 per axis on
    v5p, times M_X or M_Y); a group spanning slices crosses the data-center network, its g
    members in one slice sending through their hosts' NICs at once (a hierarchical
    collective: ICI within the slice, 1/g of the bytes over DCN; the ring of GPU nodes,
    :func:`_link`), at most ICI's rate."""
    axes = par.mx if name in ("fsdp", "dp", "ep") else par.my if name == "tp" else 1
    ici = hw.link_bandwidth() * axes * hw.eff("link")
    chips = np.asarray(device_count(par)) // np.asarray(getattr(par, "slices", 1))
    inside = np.asarray(stride) * degree <= chips
    g = members_per_node(stride, degree, chips)
    dcn = np.minimum(ici, g * hw.network_bw * hw.eff("network"))
    return (
        _scalar(_where(inside, ici, dcn)),
        _scalar(_where(inside, hw.link_latency_s, hw.network_latency_s)),
    )


def _attention_values(train: TrainSpec, par: ParallelSpec, hw: Hardware) -> dict[sp.Symbol, Any]:
    """Forward and backward fused-attention FLOP/s of the chosen kernel at the key length
    of one call: the sequence over the context-parallel degree (ring attention passes
    T/cp-key blocks)."""
    dtype = PRECISIONS[train.precision].attention_peak_dtype
    seq = np.asarray(train.seq) / np.asarray(par.cp)
    # a sweep may hold arrays of kernel names: each name's rates where it is chosen
    kernels = np.where(np.asarray(train.attention) == "flash", train.attention_kernel, "auto")
    out = {}
    for sym, phase in ((C_attn, "forward"), (C_attn_b, "backward")):
        rate: Any = 0.0
        for name in np.unique(kernels):
            here = hw.attention_peak(dtype, str(name), phase, seq)
            rate = np.where(kernels == name, here, rate)
        out[sym] = _scalar(rate)
    return out


def _scalar(x: Any) -> Any:
    return float(x) if np.ndim(x) == 0 else x


def layout_values(train: TrainSpec, par: ParallelSpec, hw: Hardware) -> dict[sp.Symbol, Any]:
    """Every parallel and hardware symbol's value (``train`` and ``par`` may hold arrays)."""
    prec = PRECISIONS[train.precision]
    dtype = prec.peak_dtype
    check_device(train.fp8_recipe, train.precision, hw)
    values: dict[sp.Symbol, Any] = {
        X: par.fsdp,
        Y: par.tp,
        N_dp: par.dp,
        N_pp: par.pp,
        N_cp: par.cp,
        N_ep: par.ep,
        N_etp: par.etp,
        rho_ep: par.ep_imbalance,
        c_cap: _scalar(np.where(np.asarray(par.capacity_factor) > 0, par.capacity_factor, np.inf)),
        m: train.grad_accum,
        v: par.pp_interleave,
        C: hw.peak(dtype),
        C_eff: hw.matmul_flops(dtype) * (gemm_rate(train.fp8_recipe) if dtype == "fp8" else 1.0),
        **_attention_values(train, par, hw),
        r_grp: hw.eff("grouped"),
        W_hbm: hw.hbm_bandwidth(),
        S_bucket: par.bucket_mb * 2**20,
        R_alloc: hw.allocator_reserve,
        t_op: _host_per_kernel(train, par, hw),
        s_sync: float(hw.kind == "cpu"),
        t_ex: hw.expert_call_s,
        **_host_values(par),
        eta_ov: hw.overlap,
        **dict(zip((N_sm, t_m, t_n), hw.gemm_tiling(dtype), strict=True)),
        k_half: hw.half_depth(dtype),
    }
    for name, (bw, alpha) in group_links(par, hw).items():
        w_sym, a_sym = _SYMBOLS[name]
        values[w_sym], values[a_sym] = bw, alpha
    values.update(_ep_values(par, hw))
    return values


def _host_per_kernel(train: TrainSpec, par: ParallelSpec, hw: Hardware) -> Any:
    """Host seconds per counted kernel: ``launch_s`` where a framework's Python modules
    launch its fused kernels (``module_launches``: Megatron-Core with Transformer Engine),
    else ``dispatch_s`` (eager ops, and torch.compile's directly launched kernels)."""
    modules = np.asarray(trait(par.framework, "module_launches"))
    fused = np.asarray(train.elementwise) == "fused"
    return _scalar(np.where(modules & fused, hw.fused_launch_s(), hw.dispatch_s))


def _host_values(par: ParallelSpec) -> dict[sp.Symbol, Any]:
    """What the host launches: whether the expert GEMMs loop over the experts (the
    framework's way where ``expert_gemm`` is ``framework``), and which kernels replay from
    CUDA graphs, and the capacity the MoE dispatch pads every expert to (``capacity_pad``:
    static shapes, no host sync; ``costmodel.parallel.host``)."""
    default = trait(par.framework, "expert_gemm_loop")
    loop = np.where(np.asarray(par.expert_gemm) == "framework", default,
                    np.asarray(par.expert_gemm) == "loop")  # fmt: skip
    graphs = np.asarray(par.cuda_graphs)
    pad = np.where(np.asarray(par.capacity_pad, dtype=bool), par.capacity_factor, 0.0)
    return {l_ex: _scalar(loop.astype(float)), g_part: _scalar((graphs == "partial") * 1.0),
            g_full: _scalar((graphs == "full") * 1.0), c_pad: _scalar(pad)}  # fmt: skip


def _ep_values(par: ParallelSpec, hw: Hardware) -> dict[sp.Symbol, Any]:
    """The expert ranks' (etp apart, then ep) links as their dispatcher uses them
    (``costmodel.kinds.dispatch``): NVLink's and one NIC's rates and the ranks a node
    holds; on a TPU every rank on ICI (``_link``'s), one copy per routed pair."""
    ici, alpha = _link("ep", par.etp, par.ep, par, hw)
    link, network, dedup = dispatch_rates(par.ep_dispatcher, hw)
    g = members_per_node(par.etp, par.ep, hw.devices_per_node)
    if hw.kind == "tpu":
        link, network, g, dedup = ici, ici, par.ep, 0.0
    values = dict(zip((W_ep, W_epn, g_ep, d_ep), (link, network, g, dedup), strict=True))
    return {a_ep: alpha, **{k: _scalar(np.asarray(e)) for k, e in values.items()}}
