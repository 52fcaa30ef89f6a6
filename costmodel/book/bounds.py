"""When is training compute-bound? The Scaling Book's conditions, symbolically.

*A Scaling Book approximation*, labelled as such wherever it is shown: it is the book's
FFN-only model at peak FLOP/s, not the full model of :mod:`costmodel.engine` (which counts
attention, the vocabulary, ring factors, latencies and achieved fractions; the app shows
both side by side).

Austin et al. 2025, "How to Scale Your Model", ch. 5 (Training): a Transformer as a stack
of FFN blocks (attention ignored up to ~32k context), ``k`` matrices of D x F per block
(2 for W_in/W_out; SwiGLU's gate behaves like W_in, so 3). Bandwidth ``W`` is a link's
bidirectional ICI bandwidth per mesh axis, collectives approximated as bytes / (W · axes)
(the book drops the (N-1)/N ring factor); on GPUs each group's own link: ``W`` the FSDP
group's (NVLink, or the network across nodes) and ``W_tp`` the tensor-parallel group's
(NVLink inside a node), the same on a TPU's torus. Forward pass, per device, bf16 (2 bytes):

    T_math = 2·k·B·D·F·L / (X·Y·C)
    T_fsdp = 2·k·D·F·L / (Y·W·M_X)        (AllGather the weight shards; only if X > 1)
    T_tp   = 4·B·D·L / (X·W_tp·M_Y)       (AllGather In, ReduceScatter Out; only if Y > 1)

A full step multiplies math by 3, FSDP by 3 (AllGather twice, ReduceScatter once) and TP
by 2 (four collectives, the backward In gather shared with the forward). The critical
batch B* solves T_math = T_fsdp + T_tp. Under ``max`` (communication overlapped, current
edition) the step takes T_math above B*; under ``sum`` (earlier edition) it takes
T_math + T_comm, twice T_math at B*. Batch B is in tokens, global.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.kinds import ffn
from costmodel.parallel.layout import members_per_node, off_tpu
from costmodel.single.params import ffn_matrices
from costmodel.single.precision import PRECISIONS
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.algebra import Var, numeric
from costmodel.symbols.core import DESCRIPTIONS, M_X, M_Y, C, D, F, L, X, Y
from costmodel.symbols.ops import integer, ratio, sqrt

if TYPE_CHECKING:  # sympy: only where a formula is printed (``latex=True``)
    import sympy as sp

B_tok = Var("B_tok", positive=True)
W_ici = Var("W_ici", positive=True)
W_tp = Var("W_tp", positive=True)
N_chips = Var("N", positive=True)
DESCRIPTIONS.update(
    {
        B_tok: "tokens per step (Scaling Book approximation)",
        W_ici: "one link's bandwidth per axis (Scaling Book approximation)",
        W_tp: "the tensor-parallel group's link bandwidth (Scaling Book approximation)",
        N_chips: "chips X·Y (Scaling Book approximation)",
    }
)
LABEL = "Scaling Book approximation (Austin et al. 2025, ch. 5)"

LEAST_RATE = 1e3
"""The least FLOP/s or bytes/s ``bounds`` takes (as a hardware profile's rates): a kilo per
second."""


def terms(model: ModelSpec, fsdp: int, tp: int, forward_only: bool) -> dict[str, sp.Expr]:
    """T_math, T_fsdp, T_tp (seconds) over B_tok, C, W_ici, X, Y, M_X, M_Y."""
    k = ffn_matrices(model)
    scale = (1, 1, 1) if forward_only else (3, 3, 2)
    return {
        "math": scale[0] * 2 * k * B_tok * D * F * L / (X * Y * C),
        "fsdp": scale[1] * 2 * k * D * F * L / (Y * W_ici * M_X) if fsdp > 1 else integer(0),
        "tp": scale[2] * 4 * B_tok * D * L / (X * W_tp * M_Y) if tp > 1 else integer(0),
    }


def critical_batch(model: ModelSpec, fsdp: int, tp: int, forward_only: bool) -> sp.Expr:
    """B* (tokens) where T_math = T_fsdp + T_tp, solved by sympy (the formula printed);
    infinite when TP alone is comm-bound. :func:`critical_value` gives its number."""
    import sympy as sp

    t = terms(model, fsdp, tp, forward_only)
    if t["fsdp"] == 0 and t["tp"] == 0:
        return sp.Integer(0)
    roots = sp.solve(sp.Eq(t["math"], t["fsdp"] + t["tp"]), B_tok.sym)
    return roots[0] if roots else sp.oo


def critical_value(
    model: ModelSpec, fsdp: int, tp: int, forward_only: bool, values: dict
) -> tuple[float | None, str]:
    """(B* in tokens or None, the regime in words) at ``values``: T_math = a·B,
    T_tp = b·B and T_fsdp = c, so B* = c / (a − b) where a > b; without communication every
    batch is compute-bound (B* = 0); where b >= a (tensor parallelism past its degree) no
    batch is."""
    with numeric({**values, B_tok: 1}):
        t = terms(model, fsdp, tp, forward_only)
        a, b, c = (float(t[k]) for k in ("math", "tp", "fsdp"))
    if b == 0 and c == 0:
        return 0.0, "no communication: compute-bound at any batch"
    if a <= b:
        return None, ("never compute-bound: tp's collectives grow with the batch as fast as "
                      "the math (tp above the conditions' largest degree)")  # fmt: skip
    if c == 0:
        return 0.0, (
            "compute-bound at any batch (tp below the conditions' largest degree, no fsdp gathers)"
        )
    return c / (a - b), "compute-bound above B*"


def conditions(model: ModelSpec) -> dict[str, sp.Expr]:
    """The book's closed forms (forward pass), each a bound on one quantity.

    - ``fsdp_min_batch_per_device``: B/X > (C/W)/M_X (DP and FSDP alike);
    - ``tp_max_degree``: Y < k/2 · F · M_Y / (C/W_tp) (independent of batch);
    - ``mixed_min_batch_per_device``: B/N > 8 (C/W)(C/W_tp) / (k · F · M_X · M_Y), the zero
      of the discriminant of the quadratic in X (4α²/(F·M_X·M_Y) for k = 2 and one W);
    - ``mixed_optimal_fsdp``: X = sqrt(2·B·N·M_X·W / (k·F·M_Y·W_tp)), minimising T_fsdp +
      T_tp for N = X·Y chips (sqrt(B·N·M_X/(F·M_Y)) for k = 2 and one W).
    """
    k = ffn_matrices(model)
    alpha, alpha_tp = C / W_ici, C / W_tp
    n = N_chips
    return {
        "fsdp_min_batch_per_device": alpha / M_X,
        "tp_max_degree": ratio(k, 2) * F * M_Y / alpha_tp,
        "mixed_min_batch_per_device": 8 * alpha * alpha_tp / (k * F * M_X * M_Y),
        "mixed_optimal_fsdp": sqrt(2 * B_tok * n * M_X * W_ici / (k * F * M_Y * W_tp)),
    }


def fsdp_link(parallel: ParallelSpec, hardware: Hardware) -> tuple[float, str]:
    """(bytes/s, its name) of the FSDP group's link at peak: a TPU's ICI link per mesh axis
    (``Hardware.link_bandwidth``); on GPUs NVLink inside one node, and for a group across
    nodes the g members a node holds sending through g NICs, min(NVLink, g x the device's
    network share) per rank (as ``costmodel.parallel.layout.group_links`` places groups,
    tp innermost, without its achieved fractions)."""
    return group_link(parallel.tp, parallel.fsdp, hardware)


def group_link(stride: int, degree: int, hardware: Hardware) -> tuple[float, str]:
    """(bytes/s, its name) of a group of ``degree`` ranks ``stride`` apart (tp: 1 apart;
    fsdp: tp apart): :func:`fsdp_link`'s rule for any group."""
    nvlink = hardware.link_bandwidth()
    if hardware.kind == "tpu":
        return nvlink, "ICI (per mesh axis, both directions)"
    if stride * degree <= hardware.devices_per_node or degree == 1:
        return nvlink, f"{hardware.intranode_link()} (inside one node of " \
            f"{hardware.devices_per_node})"  # fmt: skip
    g = int(members_per_node(stride, degree, hardware.devices_per_node))
    nodes = -(-stride * degree // hardware.devices_per_node)
    rate = min(nvlink, g * hardware.network_bw)
    return rate, (f"network across {nodes} nodes ({g} NIC(s) of "
                  f"{hardware.network_bw / 1e9:,.0f} GB/s per ring crossing a node)")  # fmt: skip


def _link_warnings(links: dict[str, str], hardware: Hardware) -> list[str]:
    """One warning per group (fsdp, tp) whose ring crosses nodes."""
    nvlink = hardware.link_bandwidth() / 1e9
    return [f"the {group} group crosses nodes: its W is the {name}, not "
            f"{hardware.intranode_link()} ({nvlink:,.0f} GB/s)" for group, name in links.items()
            if name.startswith("network")]  # fmt: skip


def bounds_report(
    model: ModelSpec,
    parallel: ParallelSpec,
    hardware: Hardware,
    *,
    precision: str = "bf16-mixed",
    forward_only: bool = False,
    peak_flops: float | None = None,
    bandwidth: float | None = None,
    latex: bool = True,
) -> dict:
    """Numbers and LaTeX for the CLI, the app and notebooks (``latex=False``: the numbers
    alone, computed without sympy).

    X, Y, M_X, M_Y and the overlap rule come from ``parallel``; C is the device's peak in
    the precision's matmul dtype and W the FSDP group's link as collectives see it
    (:func:`fsdp_link`, named in ``link``; a warning where the group crosses nodes), unless
    ``peak_flops`` / ``bandwidth`` override them.
    """
    if ffn.routes(model):
        raise SpecError("n_experts", "the Scaling Book's compute/communication bounds here are "
                        "for dense FFN stacks (n_experts must be 0); the full model covers "
                        "mixture-of-experts models")  # fmt: skip
    peak = hardware.peak(PRECISIONS[precision].peak_dtype) if peak_flops is None else peak_flops
    if hardware.kind != "tpu":
        off_tpu(parallel, hardware)
    link, link_name = fsdp_link(parallel, hardware)
    tp_link, tp_name = group_link(1, parallel.tp, hardware)  # tp innermost
    crossing = {"fsdp": link_name, "tp": tp_name}
    if bandwidth is not None:
        link, link_name, tp_link, crossing = bandwidth, "as given (--bandwidth)", bandwidth, {}
    checks.number("peak_flops", peak)
    checks.number("bandwidth", link)
    for name, value, unit in (("peak_flops", peak, "FLOP/s"), ("bandwidth", link, "bytes/s")):
        if value < LEAST_RATE:  # slower is a typo, and 1e-300 overflows every time to inf
            raise SpecError(name, f"{name} must be >= {LEAST_RATE:g} {unit} (got {value:g})")
    fsdp, tp = parallel.fsdp, parallel.tp
    values = {C: peak, W_ici: link, W_tp: tp_link, X: fsdp, Y: tp, M_X: parallel.mx,
              M_Y: parallel.my,
              D: model.d_model, F: model.d_ff, L: model.n_layers}  # fmt: skip
    b_value, regime = critical_value(model, fsdp, tp, forward_only, values)
    finite = b_value is not None
    with numeric({**values, N_chips: fsdp * tp, B_tok: b_value or 0}):
        times = {name: float(e) if finite else float("inf")
                 for name, e in terms(model, fsdp, tp, forward_only).items()}  # fmt: skip
        shown = {k: float(e) for k, e in conditions(model).items()}
    comm = times["fsdp"] + times["tp"]
    step = max(times["math"], comm) if parallel.overlap == "max" else times["math"] + comm
    n_dev = fsdp * tp
    if not finite:  # the best split of a batch no layout makes compute-bound: none
        shown.pop("mixed_optimal_fsdp")
    return {
        "approximation": LABEL,
        "model": model.name,
        "fsdp": fsdp,
        "tp": tp,
        "mx": parallel.mx,
        "my": parallel.my,
        "overlap": parallel.overlap,
        "forward_only": forward_only,
        "peak_flops": peak,
        "bandwidth": link,
        "tp_bandwidth": tp_link,
        "link": link_name,
        "tp_link": tp_name if bandwidth is None else link_name,
        "warnings": _link_warnings(crossing, hardware),
        "ici_intensity": peak / link,
        "critical_batch_tokens": b_value,
        "critical_batch_tokens_per_device": b_value / n_dev if finite else None,
        "regime": regime,
        "time_s_at_critical_batch": {**times, "step": step},
        "conditions": shown,
        **({"latex": bounds_latex(model, fsdp, tp, forward_only)} if latex else {}),
    }


def bounds_latex(model: ModelSpec, fsdp: int, tp: int, forward_only: bool) -> dict[str, str]:
    """LaTeX of B* (:func:`critical_batch`), of each time term and of each condition."""
    import sympy as sp

    return {
        "critical_batch_tokens": sp.latex(critical_batch(model, fsdp, tp, forward_only)),
        **{f"T_{k}": sp.latex(e) for k, e in terms(model, fsdp, tp, forward_only).items()},
        **{k: sp.latex(e) for k, e in conditions(model).items()},
    }
