"""The reference model's mixture-of-experts FFN (``ModelSpec.n_experts > 0``).

Token-choice top-k routing, dropless (Shazeer et al. 2017; Jiang et al. 2024, Mixtral,
Sec. 2.1): a bias-free linear router scores the E experts for every token, a softmax in
fp32 turns the scores into probabilities, each token runs its k most probable experts and
sums their outputs weighted by those probabilities renormalised to 1 (Mixtral's softmax
over the top-k logits is the same weights; Qwen2-MoE keeps them as they are). Shared
experts (Dai et al. 2024, DeepSeekMoE) run on every token, as one FFN of their summed
width, scaled by a sigmoid gate in Qwen2-MoE. Experts are looped in eager mode,
every expert every step, also one no token chose (its weights are cast and kept alike),
so what a step keeps does not depend on where tokens go: per routed token, not per
expert.
"""

from __future__ import annotations

import torch
from torch import nn

from costmodel.specs.model import ModelSpec


class MoE(nn.Module):
    """Router, ``n_experts`` routed FFNs of width ``d_ff_expert`` and the shared ones."""

    def __init__(self, spec: ModelSpec, compute: torch.dtype, ffn: type, linear: type, **fk):
        super().__init__()
        self.k = spec.experts_per_token
        self.router = linear(spec.d_model, spec.n_experts, False, compute, **fk)
        self.experts = nn.ModuleList(
            ffn(spec, compute, width=spec.d_ff_expert, **fk) for _ in range(spec.n_experts)
        )
        shared = spec.n_shared_experts * spec.d_ff_expert
        self.shared = ffn(spec, compute, width=shared, **fk) if shared else None
        self.renormalize = spec.moe_renormalize
        if spec.shared_expert_gate:  # Qwen2-MoE: sigmoid(x g) scales the shared output
            self.shared_gate = linear(spec.d_model, 1, False, compute, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        probs = torch.softmax(self.router(flat).float(), dim=-1)
        weights, chosen = probs.topk(self.k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(flat.dtype)
        out = self.shared(flat) if self.shared is not None else torch.zeros_like(flat)
        if hasattr(self, "shared_gate"):
            out = torch.sigmoid(self.shared_gate(flat)) * out
        for e, expert in enumerate(self.experts):
            token, slot = self._routed(chosen == e, e)
            out = out.index_add(0, token, expert(flat[token]) * weights[token, slot, None])
        return out.view_as(x)

    def _routed(self, mask: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token, slot) of every pair routed to expert ``e``. On the ``meta`` device, which
        holds no values, routing is balanced: expert e gets n·k/E of the n·k pairs (the
        first n·k mod E one more), the same bytes and FLOPs summed over the experts."""
        if not mask.is_meta:
            return torch.where(mask)
        pairs, experts = mask.numel(), len(self.experts)
        size = pairs // experts + int(e < pairs % experts)
        return torch.nonzero_static(mask, size=size).unbind(1)
