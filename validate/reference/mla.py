"""Multi-head latent attention for the reference model (``ModelSpec.kv_lora_rank > 0``;
DeepSeek-AI 2024, DeepSeek-V2, Sec. 2.1, and Hugging Face's ``DeepseekV3Attention``).

The normed input is projected down to a key/value latent and a RoPE key shared by the heads
(one matmul), the latent normalised and projected up to every head's key and value; the
query goes through its own normalised latent (or one projection) to ``head_dim +
rope_head_dim`` per head, whose last ``rope_head_dim`` take RoPE, as does the shared key.
The attention core (``model.NaiveAttention`` or ``model.FlashAttention``, which pads the
values to the query's width) runs on heads of query/key width ``head_dim + rope_head_dim``
and value width ``v_head_dim``. costmodel's formulas: ``costmodel/kinds/attention/latent.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from costmodel.specs.model import ModelSpec
from validate.reference.core import attend


class MLAttention(nn.Module):
    def __init__(self, spec: ModelSpec, compute, core: nn.Module, selective: bool,
                 linear: type, norm, apply_rope, **fk) -> None:  # fmt: skip
        super().__init__()
        self.spec, self.selective, self.core, self.rope = spec, selective, core, apply_rope
        d, heads, nope, pe = spec.d_model, spec.n_heads, spec.head_dim, spec.rope_head_dim
        if spec.q_lora_rank:
            self.q_a = linear(d, spec.q_lora_rank, False, compute, **fk)
            self.q_norm = norm(spec, spec.q_lora_rank, **fk)
            self.q_b = linear(spec.q_lora_rank, heads * (nope + pe), False, compute, **fk)
        else:
            self.q = linear(d, heads * (nope + pe), False, compute, **fk)
        self.kv_a = linear(d, spec.kv_lora_rank + pe, False, compute, **fk)
        self.kv_norm = norm(spec, spec.kv_lora_rank, **fk)
        self.kv_b = linear(spec.kv_lora_rank, heads * (nope + spec.v_head_dim), False, compute,
                           **fk)  # fmt: skip
        self.o = linear(heads * spec.v_head_dim, d, False, compute, **fk)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        s = self.spec
        nope, pe = s.head_dim, s.rope_head_dim
        q = self.q_b(self.q_norm(self.q_a(x))) if s.q_lora_rank else self.q(x)
        q_nope, q_pe = q.view(b, t, -1, nope + pe).split([nope, pe], dim=-1)
        latent, k_pe = self.kv_a(x).split([s.kv_lora_rank, pe], dim=-1)
        kv = self.kv_b(self.kv_norm(latent)).view(b, t, -1, nope + s.v_head_dim)
        k_nope, v = kv.split([nope, s.v_head_dim], dim=-1)
        k_pe = self.rope(k_pe.view(b, t, 1, pe), cos, sin)
        q = torch.cat((q_nope, self.rope(q_pe, cos, sin)), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)), dim=-1)
        return attend(self.core, self.selective, q, k, v, mask, self.o)
