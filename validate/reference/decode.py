"""Decoding with a KV cache on the reference model: the cache costmodel's serving terms
count (``costmodel/serving/terms.py``), allocated at once and written one token at a time.

- MHA/GQA/MQA layers cache each kv head's key (after RoPE and QK-norm) and value:
  (B, K, slots, d_h) twice; a sliding-window layer's slots are its last W tokens, a ring
  (position p in slot p mod W), so it keeps min(context, W) (Mistral 7B, Jiang et al. 2023,
  Sec. 2, "rolling buffer cache").
- MLA layers cache the normed key/value latent and the rotated RoPE key, (B, slots, r_kv +
  d_r), and decode with the up-projections absorbed (DeepSeek-V2, Sec. 2.1.2): the query's
  no-RoPE part goes through W_UK into the latent's space, scores are taken against the
  cached entries, the probabilities sum the latents, and W_UV maps the result to the
  value heads, so a step never rebuilds the keys and values of the cached tokens.
- A step's core is explicit matmuls (a GQA query group against its kv head by a reshape,
  no copy): ``torch.utils.flop_counter.FlopCounterMode`` counts each as costmodel does.

:func:`decode_step` takes B new tokens at ``position`` (the cache holds ``position`` tokens
before it) and returns their logits; a prompt is fed one token at a time (the test checks
the last logits against the model's full forward).
"""

from __future__ import annotations

import math

import torch

from validate.reference.mla import MLAttention
from validate.reference.model import TransformerLM, apply_rope, rope_tables


def slots(model: TransformerLM, block, context: int) -> int:
    """Tokens ``block``'s cache holds for a context of ``context`` tokens."""
    return min(context, model.spec.sliding_window) if block.local else context


def allocate(model: TransformerLM, batch: int, context: int, dtype: torch.dtype, device=None):
    """Every layer's empty cache for ``batch`` sequences of up to ``context`` tokens."""
    s, caches = model.spec, []
    for block in model.blocks:
        n = slots(model, block, context)
        if s.mla:
            width = s.kv_lora_rank + s.rope_head_dim
            caches.append(torch.zeros(batch, n, width, dtype=dtype, device=device))
        else:
            shape = (batch, s.n_kv_heads, n, s.head_dim)
            caches.append(tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in "kv"))
    return caches


def cache_bytes(caches) -> int:
    """Bytes the caches hold."""
    tensors = [t for c in caches for t in (c if isinstance(c, tuple) else (c,))]
    return sum(t.numel() * t.element_size() for t in tensors)


def _core(q, k, v) -> torch.Tensor:
    """softmax(q kᵀ/√d) v for one query per sequence: q (B, H, d), k (B, K, n, d),
    v (B, K, n, d_v) -> (B, H, d_v); H/K query heads share a kv head."""
    b, h, d = q.shape
    groups = h // k.shape[1]
    q = q.view(b, k.shape[1], groups, d)
    probs = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(d), dim=-1)
    return (probs @ v).reshape(b, h, -1)


def _standard(attn, x, cos, sin, cache, slot: int, filled: int) -> torch.Tensor:
    s, b = attn.spec, x.shape[0]
    q = attn.q(x).view(b, 1, -1, s.head_dim)
    k = attn.k(x).view(b, 1, -1, s.head_dim)
    if s.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    v = attn.v(x).view(b, 1, -1, s.head_dim)
    if cos is not None:
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    keys, values = cache
    keys[:, :, slot] = k[:, 0].to(keys.dtype)
    values[:, :, slot] = v[:, 0].to(values.dtype)
    used = slice(0, filled)
    o = _core(q[:, 0], keys[:, :, used].to(q.dtype), values[:, :, used].to(q.dtype))
    return attn.o(o.reshape(b, 1, -1))


def _latent(attn: MLAttention, x, cos, sin, cache, slot: int, filled: int) -> torch.Tensor:
    s, b = attn.spec, x.shape[0]
    nope, pe, rank = s.head_dim, s.rope_head_dim, s.kv_lora_rank
    q = attn.q_b(attn.q_norm(attn.q_a(x))) if s.q_lora_rank else attn.q(x)
    q_nope, q_pe = q.view(b, 1, -1, nope + pe).split([nope, pe], dim=-1)
    latent, k_pe = attn.kv_a(x).split([rank, pe], dim=-1)
    k_pe = attn.rope(k_pe.view(b, 1, 1, pe), cos, sin)
    entry = torch.cat((attn.kv_norm(latent).view(b, rank), k_pe.view(b, pe)), dim=-1)
    cache[:, slot] = entry.to(cache.dtype)
    w = attn.kv_b.weight.to(x.dtype).view(-1, nope + s.v_head_dim, rank)  # (H, d_h + d_v, r)
    w_uk, w_uv = w.split([nope, s.v_head_dim], dim=1)
    q_abs = (q_nope[:, 0].transpose(0, 1) @ w_uk).transpose(0, 1)  # (B, H, r)
    query = torch.cat((q_abs, attn.rope(q_pe, cos, sin)[:, 0]), dim=-1)  # (B, H, r + d_r)
    entries = cache[:, :filled].to(x.dtype).unsqueeze(1)  # one kv "head": (B, 1, n, r + d_r)
    scale = 1.0 / math.sqrt(nope + pe)  # the scores of the unabsorbed heads' width
    probs = torch.softmax((query.unsqueeze(2) @ entries.transpose(-2, -1)) * scale, dim=-1)
    summed = (probs @ entries[..., :rank]).squeeze(2)  # (B, H, r)
    o = (summed.transpose(0, 1) @ w_uv.transpose(1, 2)).transpose(0, 1)  # (B, H, d_v)
    return attn.o(o.reshape(b, 1, -1))


def decode_step(model: TransformerLM, ids: torch.Tensor, caches, position: int) -> torch.Tensor:
    """Logits (B, V) of ``ids`` (B, 1) at ``position``, whose keys enter the caches."""
    s, compute = model.spec, model.compute
    x = model.embed(ids)
    if s.pos == "learned":
        x = x + model.pos(torch.full_like(ids, position))
    cos = sin = None
    if s.pos == "rope":
        width = s.rope_head_dim if s.mla else s.head_dim
        cos, sin = rope_tables(1, width, compute, ids.device, start=position)
    window = s.sliding_window
    for block, cache in zip(model.blocks, caches, strict=True):
        slot = position % window if block.local else position  # a local layer's ring
        filled = min(position + 1, window) if block.local else position + 1
        run = _latent if s.mla else _standard
        h = block.norm1(x).to(compute)
        attended = run(block.attn, h, cos, sin, cache, slot, filled)
        if block.parallel:  # both branches read the one normed input
            x = x + attended + block.ffn(h)
            continue
        x = x + attended
        x = x + block.ffn(block.norm2(x).to(compute))
    return model.lm_head(model.norm_f(x).to(compute))[:, 0]


def full_logits(model: TransformerLM, ids: torch.Tensor, last: bool = False) -> torch.Tensor:
    """The model's logits at every position of ``ids`` (B, T) without a cache, or with
    ``last`` at the last one only (B, 1, V): a prefill, whose head runs on one token of
    each prompt."""
    x = model._embed(ids)
    x = model._run_blocks(x, *model._tables(ids.shape[1], ids.device))
    if last:
        x = x[:, -1:]
    return model.lm_head(model.norm_f(x).to(model.compute))


__all__ = ["allocate", "cache_bytes", "decode_step", "full_logits", "slots"]
