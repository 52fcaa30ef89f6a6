"""Parameter counts by component, as sympy expressions.

Counts follow the layer shapes of the reference model (docs/ARCHITECTURE.md): a linear of
fan-in m and fan-out n has m·n weights and, with biases, n more (Vaswani et al. 2017; Kaplan
et al. 2020, Table 1, with the embedding and norms kept instead of dropped). Units: parameters.
"""

from __future__ import annotations

import sympy as sp

from costmodel.specs.model import ModelSpec
from costmodel.symbols import (
    D,
    E_r,
    E_s,
    F,
    F_e,
    H,
    K,
    L,
    L_d,
    P,
    V,
    at_least_one,
    d_h,
    d_r,
    d_v,
    k_r,
    r_kv,
    r_q,
)


def attention_matrices(model: ModelSpec) -> list[tuple[str, sp.Expr, sp.Expr]]:
    """One block's attention matrices in forward order as (op, fan-in, fan-out).

    Standard: Q, K, V and O. MLA (DeepSeek-V2, Sec. 2.1): the query (through its
    ``r_q``-wide latent, or one projection), then ``attn_k`` the down-projection to the
    key/value latent and the shared RoPE key (D -> r_kv + d_r), ``attn_v`` the per-head
    up-projection of keys and values (r_kv -> H·(d_h + d_v)), and O; query and key heads
    are d_h + d_r wide."""
    if not model.mla:
        return [("attn_q", D, H * d_h), ("attn_k", D, K * d_h), ("attn_v", D, K * d_h),
                ("attn_o", H * d_h, D)]  # fmt: skip
    q_heads = H * (d_h + d_r)
    query = [("attn_q", D, r_q), ("attn_q", r_q, q_heads)] if model.q_lora_rank else [
        ("attn_q", D, q_heads)]  # fmt: skip
    return [*query, ("attn_k", D, r_kv + d_r), ("attn_v", r_kv, H * (d_h + d_v)),
            ("attn_o", H * d_v, D)]  # fmt: skip


def head_widths(model: ModelSpec, attention: str = "naive") -> tuple[sp.Expr, sp.Expr]:
    """(query/key, value) width of a head in the attention core: d_h both; under MLA
    d_h + d_r and d_v, the values zero-padded to the query's width for a fused kernel
    (FlashAttention-2 takes one head width; Hugging Face's DeepSeek models pad them)."""
    if not model.mla:
        return d_h, d_h
    qk = d_h + d_r
    return qk, qk if attention == "flash" else d_v


def _attention_weights(model: ModelSpec) -> sp.Expr:
    """One block's attention matmul weights."""
    return sum((m * n for _, m, n in attention_matrices(model)), sp.Integer(0))


def ffn_matrices(model: ModelSpec) -> int:
    """SwiGLU has gate, up and down projections (Shazeer 2020); GELU/ReLU have two."""
    return 3 if model.ffn == "swiglu" else 2


def block_matmuls(model: ModelSpec) -> list[tuple[str, sp.Expr, bool]]:
    """A block's matmuls in forward order: (op, output features, row-parallel).

    Q, K, V and O projections, then the FFN's (SwiGLU: gate W1, up W3, down W2, in the
    order ``W2(silu(W1 x) * W3 x)`` evaluates them). Row-parallel matmuls (O and the down
    projection) produce D-wide partial sums under tensor parallelism (Shoeybi et al. 2019,
    Sec. 3); the others' outputs are split over the TP ranks.
    """
    ffn = [("ffn", F, False)] * (ffn_matrices(model) - 1) + [("ffn", D, True)]
    if model.ffn_only:
        return ffn
    attn = [(op, n, op == "attn_o") for op, _, n in attention_matrices(model)]
    return [*attn, *ffn]


def op_level_saved(model: ModelSpec) -> list[tuple[str, sp.Expr, bool]]:
    """The matmuls whose outputs op-level selective AC saves: every odd-numbered one
    (torchtitan's "every second mm" rule; ``validate/reference/model.py``)."""
    return block_matmuls(model)[0::2]


def op_level_recomputed(model: ModelSpec, skip_last: bool = True) -> dict[str, sp.Rational]:
    """Fraction of each op's matmuls op-level selective AC runs again in backward: the
    even-numbered ones, except a block's last matmul, which torch.utils.checkpoint's early
    stop skips (its inputs are the last tensors backward needs) unless ``skip_last`` is
    false (a dropout after it keeps a mask backward needs later)."""
    order = block_matmuls(model)
    redo = [op for i, (op, _, _) in enumerate(order[: -1 if skip_last else None]) if i % 2 == 1]
    return {op: sp.Rational(redo.count(op), [o for o, _, _ in order].count(op)) for op in redo}


def _linear(fan_in: sp.Expr, fan_out: sp.Expr, bias: bool) -> sp.Expr:
    return fan_in * fan_out + (fan_out if bias else 0)


def _norm(model: ModelSpec, width: sp.Expr = D) -> sp.Expr:
    """RMSNorm has a gain vector; LayerNorm a gain and a bias (Zhang & Sennrich 2019)."""
    return width if model.norm == "rmsnorm" else 2 * width


def block_norms(model: ModelSpec) -> sp.Expr:
    """One block's norm parameters: before attention and before the FFN, and with
    ``qk_norm`` the query's and the key's over d_h (shared by the heads); under MLA its
    latents' (the key/value one's, and the query's where it has one)."""
    latents = (_norm(model, r_kv) + (_norm(model, r_q) if model.q_lora_rank else 0)
               if model.mla else 0)  # fmt: skip
    return 2 * _norm(model) + (2 * _norm(model, d_h) if model.qk_norm else 0) + latents


def ffn_params(model: ModelSpec, width: sp.Expr) -> sp.Expr:
    """One FFN of hidden width ``width``: its up (and gate) and down projections."""
    return (ffn_matrices(model) - 1) * _linear(D, width, model.bias) + _linear(width, D, model.bias)


def dense_ffn_layers(model: ModelSpec) -> sp.Expr:
    """Blocks whose FFN is dense: all of them, or an MoE model's leading ``dense_layers``."""
    return L_d if model.moe else L


def moe_layers(model: ModelSpec) -> sp.Expr:
    """Blocks whose FFN is a mixture of experts."""
    return L - L_d if model.moe else sp.Integer(0)


def top_ffn_width(model: ModelSpec) -> sp.Expr:
    """Hidden width per token of the top block's FFN backward, one FFN at a time: F, or an
    MoE block's larger of its shared experts' (E_s·F_e over every token) and one routed
    expert's (F_e over its k/E share of the tokens)."""
    if not model.moe:
        return F
    return sp.Max(E_s * F_e, k_r * F_e / E_r, evaluate=False)


def router_width(model: ModelSpec) -> sp.Expr:
    """Outputs of an MoE block's gating matmuls over D: the router's E scores, and the
    shared experts' sigmoid gate (Qwen2-MoE)."""
    return E_r + (1 if model.shared_expert_gate else 0)


def moe_params(model: ModelSpec) -> dict[str, sp.Expr]:
    """An MoE model's router (a bias-free D x E linear, with the shared experts' D x 1 gate
    where they have one), routed experts (E FFNs of width F_e) and shared experts (run as
    one FFN of width E_s·F_e), summed over its MoE blocks (Shazeer et al. 2017; Jiang et
    al. 2024, Mixtral; Dai et al. 2024, DeepSeekMoE; Qwen Team 2024, Qwen1.5-MoE)."""
    if not model.moe:
        return {}
    n = moe_layers(model)
    return {
        "router": n * D * router_width(model),
        "experts": n * E_r * ffn_params(model, F_e),
        "shared_experts": n * ffn_params(model, E_s * F_e) * at_least_one(E_s),
    }


def param_breakdown(model: ModelSpec) -> dict[str, sp.Expr]:
    """Parameters per component; the parts add up to ``total``.

    Keys: embedding, pos_embedding, attn_q, attn_k, attn_v, attn_o, ffn, norms, lm_head,
    (router, experts, shared_experts for an MoE model), total. Attention and FFN entries
    are summed over the L blocks.
    """
    zero = sp.Integer(0)
    parts: dict[str, sp.Expr] = dict.fromkeys(
        ("embedding", "pos_embedding", "attn_q", "attn_k", "attn_v", "attn_o", "norms", "lm_head"),
        zero,
    )
    parts["ffn"] = dense_ffn_layers(model) * ffn_params(model, F)
    parts.update(moe_params(model))
    if not model.ffn_only:
        parts["embedding"] = V * D
        if model.pos == "learned":
            parts["pos_embedding"] = P * D
        qkv_bias = model.bias or model.qkv_bias
        for op, fan_in, fan_out in attention_matrices(model):
            parts[op] += L * _linear(fan_in, fan_out, model.bias if op == "attn_o" else qkv_bias)
        parts["norms"] = L * block_norms(model) + _norm(model)
        parts["lm_head"] = zero if model.tied else V * D
    parts["total"] = sp.Add(*parts.values())
    return parts


def active_params(model: ModelSpec) -> sp.Expr:
    """Parameters one token runs through: all but the routed experts it is not sent to."""
    total = param_breakdown(model)["total"]
    if not model.moe:
        return total
    return total - moe_layers(model) * (E_r - k_r) * ffn_params(model, F_e)


def matmul_weight_params(model: ModelSpec) -> sp.Expr:
    """Weights that enter a matmul (every linear and the LM head, biases excluded).

    These are the tensors torch.autocast casts and keeps for backward under mixed precision.
    """
    mats = ffn_matrices(model)
    total = dense_ffn_layers(model) * mats * D * F
    if model.moe:
        total += moe_layers(model) * (D * router_width(model) + mats * D * F_e * (E_r + E_s))
    if not model.ffn_only:
        total += L * _attention_weights(model) + V * D
    return total


def weight_matrices(model: ModelSpec) -> list[tuple[sp.Expr, sp.Expr]]:
    """Every parameter with two dimensions as (how many, elements each): the embedding
    tables, each block's projections (biases excluded) and an untied head; what a
    sharding rule that splits only matrices (``validate/fsdp.py``) shards."""
    mats = ffn_matrices(model)
    dense = dense_ffn_layers(model)
    out: list[tuple[sp.Expr, sp.Expr]] = [(dense * (mats - 1), D * F), (dense, F * D)]
    if model.moe:
        n = moe_layers(model)
        out += [(n, D * router_width(model)), (n * E_r * (mats - 1), D * F_e), (n * E_r, F_e * D),
                (n * (mats - 1), D * E_s * F_e), (n, E_s * F_e * D)]  # fmt: skip
    if model.ffn_only:
        return out
    out += [(L, m * n) for _, m, n in attention_matrices(model)] + [(sp.Integer(1), V * D)]
    if model.pos == "learned":
        out.append((sp.Integer(1), P * D))
    if not model.tied:
        out.append((sp.Integer(1), V * D))
    return out


def block_params(model: ModelSpec, *, norms: bool, largest: bool = False) -> sp.Expr:
    """Parameters of one block: its attention and FFN matrices (biases included), plus its
    two norms when ``norms`` (the unit FSDP wraps and an offload block moves). An MoE
    model's blocks differ: their average (what L blocks hold together), or with
    ``largest`` an MoE block's (what FSDP gathers at once)."""
    parts = param_breakdown(model)
    keys = ("attn_q", "attn_k", "attn_v", "attn_o", "ffn", *moe_params(model))
    matrices = sum(parts[k] for k in keys) / L
    if largest and model.moe:
        attention = sum(parts[k] for k in ("attn_q", "attn_k", "attn_v", "attn_o")) / L
        matrices = attention + sum(parts[k] for k in moe_params(model)) / moe_layers(model)
    if not norms or model.ffn_only:
        return matrices
    return matrices + block_norms(model)


def stacked_blocks(model: ModelSpec, layers: sp.Expr, moe: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(parameters without norms, matmul weights) of ``layers`` blocks of which ``moe`` are
    MoE blocks (the rest dense): attention in every one, the FFN each kind has."""
    if not model.moe:
        return layers * block_params(model, norms=False), layers * _block_matmuls(model, F)
    parts = param_breakdown(model)  # (each attention part is L times one block's)
    attention = sum((parts[k] for k in ("attn_q", "attn_k", "attn_v", "attn_o")), sp.Integer(0))
    attention = attention / L
    mats = ffn_matrices(model)
    moe_mm = D * router_width(model) + mats * D * F_e * (E_r + E_s) + _block_matmuls(model, 0)
    params = layers * attention + (layers - moe) * ffn_params(model, F)
    params += moe * sum(moe_params(model).values()) / moe_layers(model)  # (L - L_d) per block
    return params, (layers - moe) * _block_matmuls(model, F) + moe * moe_mm


def _block_matmuls(model: ModelSpec, ffn_width: sp.Expr) -> sp.Expr:
    """Matmul weights of one block with a dense FFN of width ``ffn_width`` (0: none)."""
    attention = 0 if model.ffn_only else _attention_weights(model)
    return attention + ffn_matrices(model) * D * ffn_width


def non_embedding_params(model: ModelSpec) -> sp.Expr:
    """Parameters excluding the vocabulary and position matrices (Kaplan et al. 2020, Sec. 2.1).

    Kaplan's models tie the unembedding, so an untied LM head is excluded as well.
    """
    parts = param_breakdown(model)
    return parts["total"] - parts["embedding"] - parts["pos_embedding"] - parts["lm_head"]
