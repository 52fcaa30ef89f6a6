"""Parameter counts by component, as sympy expressions.

Counts follow the layer shapes of the reference model (docs/ARCHITECTURE.md): a linear of
fan-in m and fan-out n has m·n weights and, with biases, n more (Vaswani et al. 2017; Kaplan
et al. 2020, Table 1, with the embedding and norms kept instead of dropped). Units: parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds import attention, ffn
from costmodel.kinds.ffn.dense import linear as _linear
from costmodel.kinds.ffn.dense import matrices as ffn_matrices
from costmodel.specs.model import ModelSpec
from costmodel.symbols.algebra import shared
from costmodel.symbols.core import D, F, L, P, V, d_h
from costmodel.symbols.ops import add, integer, ratio

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def attention_matrices(model: ModelSpec) -> list[tuple[str, sp.Expr, sp.Expr]]:
    """One block's attention matrices in forward order as (op, fan-in, fan-out): its
    projection kind's (``costmodel.kinds.attention.projections``: Q, K, V and O, or MLA's
    latent projections)."""
    return attention.projections(model).matrices(model)


def head_widths(model: ModelSpec, kernel: str = "naive") -> tuple[sp.Expr, sp.Expr]:
    """(query/key, value) width of a head in the attention core under ``kernel``."""
    return attention.projections(model).head_widths(model, kernel)


def _attention_weights(model: ModelSpec) -> sp.Expr:
    """One block's attention matmul weights."""
    return sum((m * n for _, m, n in attention_matrices(model)), integer(0))


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
    return {op: ratio(redo.count(op), [o for o, _, _ in order].count(op)) for op in redo}


def _norm(model: ModelSpec, width: sp.Expr = D) -> sp.Expr:
    """RMSNorm has a gain vector; LayerNorm a gain and a bias (Zhang & Sennrich 2019)."""
    return width if model.norm == "rmsnorm" else 2 * width


def block_norms(model: ModelSpec) -> sp.Expr:
    """One block's norm parameters: before attention and before the FFN (one for both in a
    parallel block), and with ``qk_norm`` the query's and the key's over d_h (shared by the
    heads); and those of its attention projections (MLA's latents': the key/value one's,
    and the query's where it has one)."""
    widths = attention.projections(model).norm_widths(model)
    latents = sum((_norm(model, w) for w in widths), integer(0))
    pre = 1 if model.parallel_block else 2
    return pre * _norm(model) + (2 * _norm(model, d_h) if model.qk_norm else 0) + latents


@shared
def param_breakdown(model: ModelSpec) -> dict[str, sp.Expr]:
    """Parameters per component; the parts add up to ``total``.

    Keys: embedding, pos_embedding, attn_q, attn_k, attn_v, attn_o, norms, lm_head, the
    FFN kinds' ops (``ffn``; an MoE model's router, experts, shared_experts:
    ``costmodel.kinds.ffn``), total. Attention and FFN entries are summed over the blocks.
    """
    zero = integer(0)
    parts: dict[str, sp.Expr] = dict.fromkeys(
        ("embedding", "pos_embedding", "attn_q", "attn_k", "attn_v", "attn_o", "norms", "lm_head"),
        zero,
    )
    parts.update(ffn.by_op(model, lambda kind: kind.params(model)))
    if not model.ffn_only:
        parts["embedding"] = V * D
        if model.pos == "learned":
            parts["pos_embedding"] = P * D
        qkv_bias = model.bias or model.qkv_bias
        for op, fan_in, fan_out in attention_matrices(model):
            parts[op] += L * _linear(fan_in, fan_out, model.bias if op == "attn_o" else qkv_bias)
        parts["norms"] = L * block_norms(model) + _norm(model)
        parts["lm_head"] = zero if model.tied else V * D
    parts["total"] = add(*parts.values())
    return parts


@shared
def active_params(model: ModelSpec) -> sp.Expr:
    """Parameters one token runs through: all but the routed experts it is not sent to."""
    return param_breakdown(model)["total"] - ffn.total(model, lambda kind: kind.unused(model))


def matmul_weight_params(model: ModelSpec) -> sp.Expr:
    """Weights that enter a matmul (every linear and the LM head, biases excluded).

    These are the tensors torch.autocast casts and keeps for backward under mixed precision.
    """
    total = ffn.total(model, lambda kind: kind.matmul_weights(model))
    if not model.ffn_only:
        total += L * _attention_weights(model) + V * D
    return total


def weight_matrices(model: ModelSpec) -> list[tuple[sp.Expr, sp.Expr]]:
    """Every parameter with two dimensions as (how many, elements each): the embedding
    tables, each block's projections (biases excluded) and an untied head; what a
    sharding rule that splits only matrices (``validate/fsdp.py``) shards."""
    out = [(count * n, size) for kind, count in ffn.blocks(model)
           for n, size in kind.weight_matrices(model)]  # fmt: skip
    if model.ffn_only:
        return out
    out += [(L, m * n) for _, m, n in attention_matrices(model)] + [(integer(1), V * D)]
    if model.pos == "learned":
        out.append((integer(1), P * D))
    if not model.tied:
        out.append((integer(1), V * D))
    return out


@shared
def block_params(model: ModelSpec, *, norms: bool, largest: bool = False) -> sp.Expr:
    """Parameters of one block: its attention and FFN matrices (biases included), plus its
    two norms when ``norms`` (the unit FSDP wraps and an offload block moves). An MoE
    model's blocks differ: their average (what L blocks hold together), or with
    ``largest`` the top block's (an MoE block's: what FSDP gathers at once)."""
    if largest:
        matrices = _attention_params(model) + sum(ffn.top(model).params(model).values())
    else:
        parts = param_breakdown(model)
        keys = ("attn_q", "attn_k", "attn_v", "attn_o", *ffn.ops(model))
        matrices = sum(parts[k] for k in keys) / L
    if not norms or model.ffn_only:
        return matrices
    return matrices + block_norms(model)


def _attention_params(model: ModelSpec) -> sp.Expr:
    """One block's attention parameters (biases included)."""
    parts = param_breakdown(model)  # (each attention part is L times one block's)
    return sum((parts[k] for k in ("attn_q", "attn_k", "attn_v", "attn_o")), integer(0)) / L


def stacked_blocks(model: ModelSpec, counts: list[tuple[Any, sp.Expr]]) -> tuple[sp.Expr, sp.Expr]:
    """(parameters without norms, matmul weights) of blocks given as (FFN kind, how many)
    (``costmodel.kinds.ffn.blocks``' form): attention in every one, the FFN of its kind."""
    attention, attention_mm = _attention_params(model), _block_matmuls(model)
    params = add(*(n * (attention + sum(kind.params(model).values())) for kind, n in counts))
    mm = add(*(n * (attention_mm + kind.matmul_weights(model)) for kind, n in counts))
    return params, mm


def _block_matmuls(model: ModelSpec) -> sp.Expr:
    """Attention matmul weights of one block (none in an FFN-only stack)."""
    return 0 if model.ffn_only else _attention_weights(model)


@shared
def non_embedding_params(model: ModelSpec) -> sp.Expr:
    """Parameters excluding the vocabulary and position matrices (Kaplan et al. 2020, Sec. 2.1).

    Kaplan's models tie the unembedding, so an untied LM head is excluded as well.
    """
    parts = param_breakdown(model)
    return parts["total"] - parts["embedding"] - parts["pos_embedding"] - parts["lm_head"]
