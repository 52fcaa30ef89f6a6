"""Serving's terms on one device, as sympy over the model's symbols, B sequences, T tokens
and tp's Y ranks (``costmodel.symbols``).

- **KV cache** (elements): every layer caches ``cached()`` elements per token (its attention
  projection kind: 2·K·d_h for MHA/GQA/MQA, r_kv + d_r for MLA) for ``cached_keys()`` of a
  sequence's T tokens (its core kind: all T, or the last W of a sliding window).
- **Weights** (elements): each block matrix at the share its projection kind gives a tp rank
  (heads split, MLA's down-projections whole), the FFN, embedding and head split over Y
  (Megatron's split, Shoeybi et al. 2019, Sec. 3; vocabulary-parallel embedding and head),
  norms whole.
- **FLOPs**: 2 per multiply-add (Kaplan et al. 2020, Table 1) over the device's share of
  every matrix; prefill runs the head on each sequence's last token only; the core scores
  and sums over cached keys (a decode step) or over the fused kernel's tiles of a causal or
  windowed prompt (``costmodel.kinds.attention``).
- **Routed experts read by a decode step**: with B·k routing picks drawn uniformly among E
  experts, a layer's expected distinct experts are E·(1 − (1 − k/E)^B) (each expert is
  missed by every pick with probability (1 − k/E)^B).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from costmodel.kinds import attention, ffn
from costmodel.single.params import param_breakdown
from costmodel.symbols.core import B, D, E_r, H, L, V, Y, k_r
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

EMBEDDINGS = ("embedding", "pos_embedding", "lm_head", "norms")


@cache
def kv_elements(model: Any) -> sp.Expr:
    """Cache elements of one sequence of T tokens on a device, over all layers."""
    proj = attention.projections(model)
    return attention.total(model, lambda kind: kind.cached_keys()) * proj.cached(model)


@cache
def kv_elements_per_token(model: Any) -> sp.Expr:
    """Cache elements one token adds on a device while every layer still keeps it."""
    return L * attention.projections(model).cached(model)


@cache
def block_weights(model: Any) -> sp.Expr:
    """Matrix elements of the blocks one tp rank holds (the routed experts included)."""
    proj = attention.projections(model)
    attn = sum(
        (fan_in * fan_out * share for (_, fan_in, fan_out), share in
         zip(proj.matrices(model), proj.split_shares(model), strict=True)),
        integer(0),
    )  # fmt: skip
    parts = param_breakdown(model)
    ffn_total = sum((parts[op] for op in ffn.ops(model)), integer(0))
    return L * attn + ffn_total / Y


@cache
def other_weights(model: Any) -> sp.Expr:
    """Embedding and head (split over Y) and norms and learned positions (whole)."""
    parts = param_breakdown(model)
    return (parts["embedding"] + parts["lm_head"]) / Y + parts["norms"] + parts["pos_embedding"]


@cache
def unread_embedding(model: Any) -> sp.Expr:
    """Elements of the embedding table a step does not read: an untied table's, whose
    lookup reads one row per token (a tied table is read whole as the head)."""
    return integer(0) if model.tied else param_breakdown(model)["embedding"] / Y


@cache
def expert_weights(model: Any) -> sp.Expr:
    """Routed-expert elements one tp rank holds (0 for a dense model)."""
    return param_breakdown(model).get("experts", integer(0)) / Y


@cache
def touched_experts(model: Any, tokens: sp.Expr) -> sp.Expr:
    """Share of the routed experts that ``tokens`` route to (uniform routing; module
    docstring); 1 for a dense model, whose expert term is 0."""
    if not ffn.routes(model):
        return integer(1)
    return 1 - (1 - k_r / E_r) ** tokens


@cache
def linear_flops(model: Any, tokens: sp.Expr, head_tokens: sp.Expr) -> sp.Expr:
    """Matmul FLOPs of the projections, FFNs and head on a device: ``tokens`` through the
    blocks, ``head_tokens`` through the head."""
    proj = attention.projections(model)
    attn = sum(
        (2 * fan_in * fan_out * share for (_, fan_in, fan_out), share in
         zip(proj.matrices(model), proj.split_shares(model), strict=True)),
        integer(0),
    )  # fmt: skip
    per_token = ffn.by_op(model, lambda kind: kind.forward_flops(model))
    ffn_flops = sum(per_token.values(), integer(0))
    return tokens * (L * attn + ffn_flops / Y) + 2 * head_tokens * D * V / Y


@cache
def expert_flops(model: Any, tokens: sp.Expr) -> sp.Expr:
    """Matmul FLOPs of the routed experts on a device for ``tokens`` through the blocks
    (part of :func:`linear_flops`; 0 for a dense model): one grouped kernel runs them."""
    per_token = ffn.by_op(model, lambda kind: kind.forward_flops(model))
    return tokens * per_token.get("experts", integer(0)) / Y


@cache
def layer_widths(model: Any) -> sp.Expr:
    """Widths one token's pass through a layer writes beside its input on a device: every
    projection's output and the FFN's hidden widths (its per-token FLOPs over 2·D)."""
    proj = attention.projections(model)
    outs = sum(
        (
            fan_out * share
            for (_, _, fan_out), share in zip(
                proj.matrices(model), proj.split_shares(model), strict=True
            )
        ),
        integer(0),
    )
    per_token = ffn.by_op(model, lambda kind: kind.forward_flops(model))
    return outs + sum(per_token.values(), integer(0)) / (2 * D) / Y / L


@cache
def decode_core_flops(model: Any) -> sp.Expr:
    """One decode step's core on a device: each of B queries over its cached keys, per
    head 2 FLOPs per key and width for the scores and for the values."""
    width_s, width_v = attention.projections(model).decode_widths(model)
    keys = attention.total(model, lambda kind: kind.cached_keys())
    return 2 * B * (H / Y) * (width_s + width_v) * keys


@cache
def prefill_core_flops(model: Any) -> sp.Expr:
    """A prompt of T tokens per sequence through the fused kernel's tiles, on a device."""
    d_qk, d_val = attention.projections(model).head_widths(model, "flash")
    pairs = attention.total(model, lambda kind: kind.fused_pairs())
    return 2 * B * (H / Y) * (d_qk + d_val) * pairs


__all__ = [
    "block_weights",
    "decode_core_flops",
    "expert_flops",
    "expert_weights",
    "kv_elements",
    "kv_elements_per_token",
    "layer_widths",
    "linear_flops",
    "other_weights",
    "prefill_core_flops",
    "touched_experts",
    "unread_embedding",
]
