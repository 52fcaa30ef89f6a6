"""Every symbol of the cost model, declared once with its assumptions, as the formulas use
them: each a :class:`~costmodel.symbols.algebra.Var`, its sympy symbol where formulas build
expressions and its value where they compute numbers (:mod:`costmodel.symbols.algebra`).
Users get the sympy symbols themselves from :mod:`costmodel.symbols`.
"""

from __future__ import annotations

import difflib
from typing import Any

from costmodel.symbols.algebra import (  # noqa: F401 (formulas import them from here)
    UnboundSymbol,
    Var,
    as_expr,
    bind,
    numeric,
    resolve,
    symbolic,
    symbols,
)
from costmodel.symbols.ops import (  # noqa: F401 (formulas import them from here)
    at_least_one,
    log,
    more_than_one,
    ratio,
    sceil,
    sfloor,
    smax,
    smin,
    sqrt,
)

_INT = {"integer": True, "positive": True}

B, b, T = symbols("B b T", **_INT)
r_a = Var("r", **_INT)  # a LoRA adapter's rank
L_rc = Var("L_rc", **_INT)  # blocks checkpointed in full: ceil(L / recompute_every)
V, D, F, L, H, K, P = symbols("V D F L H K P", **_INT)
d_h = Var("d_h", **_INT)
# mixture of experts: routed experts, experts per token, shared experts, dense leading
# layers (all 0 for a dense model) and one expert's width
_COUNT = {"integer": True, "nonnegative": True}
E_r, k_r, E_s, L_d = symbols("E k E_s L_d", **_COUNT)
F_e = Var("F_e", **_INT)
# multi-head latent attention: the query's and the keys' and values' latent widths (0
# without), each head's RoPE width (0 without) and value width
r_q, r_kv, d_r = symbols("r_q r_kv d_r", **_COUNT)
d_v = Var("d_v", **_INT)
# sliding-window attention: the keys a local layer's query sees (0 without) and the number
# of local layers (costmodel.kinds.attention)
W_sw, L_loc = symbols("W_sw L_loc", **_COUNT)

MODEL_SYMBOLS: tuple[Var, ...] = (V, D, F, L, H, K, d_h, P, E_r, k_r, E_s, L_d, F_e,
                                        r_q, r_kv, d_r, d_v, W_sw, L_loc)  # fmt: skip
TRAIN_SYMBOLS: tuple[Var, ...] = (B, b, T, r_a, L_rc)
ALL_SYMBOLS: tuple[Var, ...] = MODEL_SYMBOLS + TRAIN_SYMBOLS

DESCRIPTIONS: dict[Var, str] = {
    V: "vocabulary size",
    D: "model width (d_model)",
    F: "FFN hidden width (d_ff)",
    L: "layers",
    H: "query heads",
    K: "key/value heads",
    d_h: "head width",
    P: "learned position table length",
    E_r: "routed experts per MoE layer",
    k_r: "routed experts per token",
    E_s: "shared experts per MoE layer",
    L_d: "dense leading layers of an MoE model",
    F_e: "one expert's FFN width",
    r_q: "MLA query latent width (q_lora_rank)",
    r_kv: "MLA key/value latent width (kv_lora_rank)",
    d_r: "MLA RoPE width per head",
    d_v: "value width per head",
    W_sw: "sliding window: keys a local layer's query sees",
    L_loc: "local (sliding-window) layers",
    B: "sequences per optimizer step",
    b: "sequences per micro-batch",
    T: "sequence length (tokens)",
    r_a: "LoRA adapter rank",
    L_rc: "blocks checkpointed in full (ceil(L / recompute_every))",
}


def local_layers(n_layers: Any, sliding_window: Any, global_every: Any) -> Any:
    """Layers with a sliding window (scalars stay Python ints, or numpy arrays): all of
    them but every ``global_every``-th (``ModelSpec.is_local``); none without a window."""
    every = global_every + (global_every == 0)  # 1 where there is no pattern
    global_layers = n_layers // every * (global_every > 0)
    return (n_layers - global_layers) * (sliding_window > 0)


def values_for(model, train=None) -> dict[Var, int]:
    """Symbol -> integer value for a ModelSpec (and optionally a TrainSpec)."""
    values = {
        V: model.vocab,
        D: model.d_model,
        F: model.d_ff,
        L: model.n_layers,
        H: model.n_heads,
        K: model.n_kv_heads,
        d_h: model.head_dim,
        P: model.max_positions,
        E_r: model.n_experts,
        k_r: model.experts_per_token,
        E_s: model.n_shared_experts,
        L_d: model.dense_layers,
        F_e: model.d_ff if model.d_ff_expert is None else model.d_ff_expert,
        r_q: model.q_lora_rank,
        r_kv: model.kv_lora_rank,
        d_r: model.rope_head_dim,
        d_v: model.head_dim if model.v_head_dim is None else model.v_head_dim,
        W_sw: model.sliding_window,
        L_loc: local_layers(model.n_layers, model.sliding_window, model.global_every),
    }
    if train is not None:
        every = getattr(train, "recompute_every", 1)
        values.update({B: train.batch, b: train.batch // train.grad_accum, T: train.seq,
                       r_a: train.lora_rank, L_rc: -(-model.n_layers // every)})  # fmt: skip
    return values


# Parallelism (Scaling Book: X FSDP, Y tensor; M_X, M_Y mesh axes) and hardware.
X, Y = symbols("X Y", **_INT)  # fsdp, tp degrees
N_dp, N_pp, N_cp = symbols("N_dp N_pp N_cp", **_INT)
N_ep = Var("N_ep", **_INT)  # expert-parallel degree
N_etp = Var("N_etp", **_INT)  # expert tensor-parallel degree
rho_ep = Var("rho_ep", positive=True)  # the busiest ep rank's routed tokens / mean
c_cap = Var("c_cap", positive=True)  # an expert's capacity over the mean (inf: dropless)
m, v = symbols("m v", **_INT)  # micro-batches per step, virtual pipeline stages
M_X, M_Y = symbols("M_X M_Y", **_INT)
_POS = {"positive": True}
C, C_eff, C_attn, W_hbm = symbols("C C_eff C_attn W_hbm", **_POS)  # FLOP/s, HBM B/s
C_attn_b = Var("C_attn_b", **_POS)  # the fused attention backward's FLOP/s
W_X, W_Y, W_dp, W_pp, W_cp, W_ep = symbols("W_X W_Y W_dp W_pp W_cp W_ep", **_POS)  # B/s
a_X, a_Y, a_dp, a_pp, a_cp, a_ep = symbols(
    "alpha_X alpha_Y alpha_dp alpha_pp alpha_cp alpha_ep", **_POS
)
W_epn = Var("W_epn", **_POS)  # an ep rank's share of the NICs, B/s
g_ep = Var("g_ep", **_INT)  # ep ranks one node holds
d_ep = Var("d_ep", nonnegative=True)  # 1: one copy per destination rank and node
h_nd = Var("h_nd", nonnegative=True)  # other nodes a token's experts hit
h_rk = Var("h_rk", nonnegative=True)  # other ranks a token's experts hit
S_bucket = Var("S_bucket", **_POS)  # DDP bucket bytes
R_alloc = Var("R_alloc", **_POS)  # reserved over allocated bytes (caching allocator)
t_op = Var("t_op", nonnegative=True)  # host seconds per counted kernel
s_sync = Var("s_sync", nonnegative=True)  # 1: kernels run on the dispatching thread
t_ex = Var("t_ex", nonnegative=True)  # host seconds per expert GEMM a loop launches
l_ex = Var("l_ex", nonnegative=True)  # 1: the expert GEMMs loop over experts on the host
g_part = Var("g_part", nonnegative=True)  # 1: attention and MoE routing in CUDA graphs
g_full = Var("g_full", nonnegative=True)  # 1: the whole step replayed from a CUDA graph
c_pad = Var("c_pad", nonnegative=True)  # capacity an expert is padded to (0: none)
eta_ov = Var("eta_ov", nonnegative=True)  # share of overlapped comm that truly hides
N_sm, t_m, t_n = symbols("N_sm t_m t_n", **_INT)  # SMs; a GEMM result tile's rows, cols
k_half = Var("k_half", nonnegative=True)  # depth at half the GEMM efficiency (0: flat)
r_grp = Var("r_grp", positive=True)  # grouped expert GEMMs' efficiency over a dense GEMM's

PARALLEL_SYMBOLS: tuple[Var, ...] = (X, Y, N_dp, N_pp, N_cp, N_ep, N_etp, rho_ep, c_cap, m,
                                           v)  # fmt: skip
HARDWARE_SYMBOLS: tuple[Var, ...] = (
    C,
    C_eff,
    C_attn,
    C_attn_b,
    r_grp,
    W_hbm,
    W_X,
    W_Y,
    W_dp,
    W_pp,
    W_cp,
    W_ep,
    W_epn,
    g_ep,
    d_ep,
    h_nd,
    h_rk,
    a_X,
    a_Y,
    a_dp,
    a_pp,
    a_cp,
    a_ep,
    S_bucket,
    R_alloc,
    t_op,
    s_sync,
    t_ex,
    l_ex,
    g_part,
    g_full,
    c_pad,
    eta_ov,
    N_sm,
    t_m,
    t_n,
    k_half,
)
DESCRIPTIONS.update(
    {
        X: "FSDP (ZeRO) degree",
        Y: "tensor-parallel degree",
        N_dp: "data-parallel replicas",
        N_pp: "pipeline stages",
        N_cp: "context-parallel degree",
        N_ep: "expert-parallel degree",
        N_etp: "expert tensor-parallel degree",
        rho_ep: "routed tokens the busiest expert-parallel rank receives over the mean",
        c_cap: "routed pairs an expert takes at most over the mean (capacity factor)",
        m: "micro-batches per step",
        v: "virtual pipeline stages per device",
        M_X: "mesh axes for X",
        M_Y: "mesh axes for Y",
        C: "peak FLOP/s per device",
        C_eff: "achieved matmul FLOP/s",
        C_attn: "achieved attention FLOP/s (forward)",
        C_attn_b: "achieved attention FLOP/s (backward)",
        r_grp: "routed experts' grouped GEMMs' efficiency over a dense GEMM's of the same shape",
        W_hbm: "achieved HBM B/s",
        W_X: "FSDP group bandwidth",
        W_Y: "TP group bandwidth",
        W_dp: "DP group bandwidth",
        W_pp: "pipeline link bandwidth",
        W_cp: "CP ring bandwidth",
        W_ep: "EP dispatch bandwidth inside a node (NVLink)",
        W_epn: "EP dispatch bandwidth across nodes (one NIC per rank)",
        g_ep: "expert-parallel ranks one node holds",
        d_ep: "1 where the dispatcher sends a token once per destination rank and node",
        h_nd: "other nodes one token's routed experts hit (the router's spread)",
        h_rk: "other expert-parallel ranks one token's routed experts hit",
        S_bucket: "DDP bucket bytes",
        R_alloc: "allocator's reserved over allocated bytes",
        t_op: "host seconds per counted kernel (per eager op, or per fused-count kernel)",
        s_sync: "1 where kernels run on the dispatching thread (CPU), 0 where asynchronous",
        t_ex: "host seconds per expert GEMM a per-expert grouped linear launches",
        l_ex: "1 where the expert GEMMs loop over the local experts on the host, 0 for one "
        "grouped kernel",
        g_part: "1 where each block's attention and MoE routing replay from CUDA graphs",
        g_full: "1 where the whole forward and backward replay from one CUDA graph",
        c_pad: "routed pairs every expert runs over the mean where the dispatch pads to its "
        "capacity (static shapes, no host sync); 0 where it runs the pairs as routed",
        eta_ov: "share of the shorter of compute and overlapped communication that runs "
        "concurrently (1: perfect overlap)",
        N_sm: "streaming multiprocessors (GEMM tiles run at once)",
        t_m: "rows of a GEMM result tile",
        t_n: "columns of a GEMM result tile",
        k_half: "reduction depth at which the precision's GEMMs run at half their efficiency "
        "(0: every depth at the full efficiency)",
    }
)

# What a training run costs (named quantities ``train_days`` and ``train_cost``).
N_tok = Var("N_tok", positive=True)  # tokens to train on
price = Var("price", nonnegative=True)  # currency per device-hour
BUDGET_SYMBOLS: tuple[Var, ...] = (N_tok, price)
DESCRIPTIONS.update({N_tok: "token budget", price: "price per device-hour"})

# One attention call (costmodel.single.attention): its heads and the flash kernel's tile.
h_call = Var("h", **_INT)
B_tile = Var("B_r", **_INT)
DESCRIPTIONS.update({h_call: "heads in one attention call", B_tile: "flash tile rows (B_r = B_c)"})


SYMBOLS: dict[str, Var] = {
    str(s): s for s in (*ALL_SYMBOLS, *PARALLEL_SYMBOLS, *HARDWARE_SYMBOLS, *BUDGET_SYMBOLS,
                        M_X, M_Y, h_call, B_tile)
}  # fmt: skip
"""Every symbol by its printed name (``"T"``, ``"alpha_X"``, ``"d_h"``)."""


def symbol(name: str) -> Var:
    """The package's symbol printed as ``name`` (with its assumptions; module doc)."""
    try:
        return SYMBOLS[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
        close = difflib.get_close_matches(str(name), sorted(SYMBOLS), n=3)
        said = f"did you mean {' or '.join(map(repr, close))}?" if close else (
            "costmodel.symbols.SYMBOLS lists them all")  # fmt: skip
        raise UnknownSymbol(f"unknown symbol {name!r}; {said}") from None


class UnknownSymbol(KeyError):
    """A name no symbol has (a KeyError whose ``str()`` is its sentence, as
    ``costmodel.specs.checks.UnknownKey``'s; this bottom layer imports nothing of the
    package)."""

    def __str__(self) -> str:
        return str(self.args[0])
