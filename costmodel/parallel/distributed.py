"""Per-device memory and communication under DP, FSDP (ZeRO 1/2/3), TP (+SP), PP and CP.

Sources: ZeRO stages (Rajbhandari et al. 2020, Sec. 5); tensor and sequence parallel
activations (Korthikanti et al. 2022, Table 2: sbh(10 + 24/t + 5as/ht) without SP, all /t
with SP); 1F1B keeps p micro-batches of L/p layers in flight on the first stage, and
interleaving adds (1 + (p-1)/(p·v)) (ibid., Sec. 4.2.3; Narayanan et al. 2021);
ring collectives move 2(N-1)/N of the buffer for an all-reduce and (N-1)/N for an
all-gather or reduce-scatter, with (N-1) or 2(N-1) latency steps (Thakur et al. 2005;
the alpha-beta model); ring attention passes K and V chunks N-1 times per layer forward
and K, V, dK, dV backward (Liu et al. 2023). Bytes, per device, per optimizer step.
"""

from __future__ import annotations

import sympy as sp

from costmodel.parallel.collectives import bus_factor, ring_steps
from costmodel.single.memory import (
    activation_memory,
    kept_weight_copies,
    peak_memory,
    state_memory,
)
from costmodel.single.params import matmul_weight_params, param_breakdown
from costmodel.single.precision import PRECISIONS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols import (
    W_X,
    W_Y,
    D,
    K,
    L,
    N_cp,
    N_dp,
    N_pp,
    S_bucket,
    T,
    V,
    W_cp,
    W_dp,
    W_pp,
    X,
    Y,
    a_cp,
    a_dp,
    a_pp,
    a_X,
    a_Y,
    as_expr,
    b,
    d_h,
    m,
    smax,
    v,
)

_TP_SHARDED = ("attention", "attn_out_input", "ffn_hidden", "loss")
_CONSTANTS = ("inputs", "embedding", "rope", "attn_mask")


def device_batch() -> tuple[sp.Expr, sp.Expr]:
    """(sequences, tokens per sequence) one device handles per micro-batch."""
    return b / (N_dp * X), T / N_cp


def params_per_device(model: ModelSpec, par: ParallelSpec) -> tuple[sp.Expr, sp.Expr]:
    """(all, matmul-weight) parameters one device holds before ZeRO: blocks of one stage
    split over tp (norms replicated), vocabulary matrices split over tp (vocab-parallel);
    with pp > 1 the first stage has the embedding, the last the head: the larger counts."""
    parts = param_breakdown(model)
    block = sum(parts[k] for k in ("attn_q", "attn_k", "attn_v", "attn_o", "ffn")) / L
    norm_total = parts["norms"]
    vocab_in = parts["embedding"] + parts["pos_embedding"]
    head = parts["lm_head"]
    vocab = smax(vocab_in, head) if par.pp > 1 else vocab_in + head
    layers = L / N_pp
    total = layers * (block / Y) + norm_total / (N_pp if par.pp > 1 else 1) + vocab / Y
    head_mm = 0 if model.ffn_only else V * D
    mm = layers * (matmul_weight_params(model) - head_mm) / L / Y + head_mm / Y
    return total, mm


def sharded_state(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, sp.Expr]:
    """params (working weights), master, grads, optimizer per device, ZeRO over X."""
    n, n_mm = params_per_device(model, par)
    head = None if model.ffn_only else V * D / Y
    kept = kept_weight_copies(model, train, matmul=n_mm, head=head)
    shards = (X if par.zero == 3 else 1, X if par.zero >= 2 else 1, X)
    return state_memory(model, train, params=n, kept_copies=kept, shards=shards)


def sharded_activations(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> sp.Expr:
    """Activations one device keeps, in terms of the global micro-batch b and T."""
    parts = activation_memory(model, train)
    parts.pop("total")
    total = sp.Integer(0)
    interleave = 1 + (N_pp - 1) / (N_pp * v) if par.pp_interleave > 1 else 1
    for op, expr in parts.items():
        if op in _CONSTANTS:
            total += expr
            continue
        sharded = par.sequence_parallel or op in _TP_SHARDED
        block = op not in ("final_norm", "lm_head_input", "loss")
        total += expr / (Y if sharded else 1) * (interleave if block else 1)
    return total


def sharded_memory(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, sp.Expr]:
    """Per-device memory by component and its peak (same estimate as one device, plus
    ZeRO-3's two gathered layers in flight)."""
    state = sharded_state(model, train, par)
    acts = sharded_activations(model, train, par)
    per_device = dict(zip(("b", "T"), device_batch(), strict=True))
    subs = {b: per_device["b"], T: per_device["T"]}
    # a plain symbol swap; unevaluated so the peaks' Max terms are not re-simplified
    with sp.evaluate(False):
        peaks = {k: e.xreplace(subs) for k, e in peak_memory(model, train, state, acts).items()}
    if par.zero == 3:
        _, n_mm = params_per_device(model, par)
        gathered = 2 * PRECISIONS[train.precision].activation * n_mm * N_pp / L * (1 - 1 / X)
        peaks = {k: e + gathered for k, e in peaks.items()}
    return {**state, "activations": acts.xreplace(subs), **peaks}


def communication(model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict[str, dict]:
    """Per group: bytes sent per device per step and alpha-beta seconds, split by phase.

    Returns ``{group: {"bytes": e, "forward": t, "backward": t, "optimizer": t}}``.
    Gradients and gathered parameters travel in the compute dtype (bf16 under mixed
    precision, as FSDP's MixedPrecisionPolicy and Megatron's bf16 reduce).
    """
    prec = PRECISIONS[train.precision]
    c = prec.activation
    n, _ = params_per_device(model, par)
    layers = L / N_pp
    b_dev, t_dev = device_batch()
    groups: dict[str, dict] = {}

    dp_bytes = bus_factor("all_reduce", N_dp) * c * n / X
    buckets = sp.ceiling(c * n / X / S_bucket)
    groups["dp"] = _phases(
        dp_bytes, 0, dp_bytes / W_dp + ring_steps("all_reduce", N_dp) * a_dp * buckets, 0
    )

    gather = bus_factor("all_gather", X) * c * n
    if par.zero == 3:
        fwd, bwd, opt = gather, 2 * gather, 0
    else:
        fwd, bwd, opt = 0, gather, gather
    steps = ring_steps("all_gather", X)  # a reduce-scatter takes as many
    lat = layers * steps * a_X
    groups["fsdp"] = _phases(
        fwd + bwd + opt, fwd / W_X + lat, bwd / W_X + 2 * lat, opt / W_X + steps * a_X
    )

    act = c * b_dev * t_dev * D
    per_layer = 1 if model.ffn_only else 2
    fwd_n = m * layers * per_layer
    bwd_n = m * layers * per_layer * (2 if train.recompute == "full" else 1)
    tp_one = bus_factor("all_reduce", Y) * act
    groups["tp"] = _phases(
        (fwd_n + bwd_n) * tp_one,
        fwd_n * (tp_one / W_Y + ring_steps("all_reduce", Y) * a_Y),
        bwd_n * (tp_one / W_Y + ring_steps("all_reduce", Y) * a_Y),
        0,
    )

    p2p = act / (Y if par.sequence_parallel else 1)
    sends = m * v * (N_pp - 1) / N_pp
    one = sends * (p2p / W_pp + a_pp)
    groups["pp"] = _phases(2 * sends * p2p, one, one, 0)

    if model.ffn_only:
        groups["cp"] = _phases(0, 0, 0, 0)
    else:
        kv = 2 * c * b_dev * t_dev * K * d_h / Y
        steps = m * layers * ring_steps("all_gather", N_cp)  # K/V passed round the ring
        groups["cp"] = _phases(
            3 * steps * kv, steps * (kv / W_cp + a_cp), 2 * steps * (kv / W_cp + a_cp), 0
        )
    return groups


def _phases(total_bytes, forward, backward, optimizer) -> dict[str, sp.Expr]:
    return {
        "bytes": as_expr(total_bytes),
        "forward": as_expr(forward),
        "backward": as_expr(backward),
        "optimizer": as_expr(optimizer),
    }
