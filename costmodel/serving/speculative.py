"""Speculative decoding: a drafter proposes ``draft_tokens`` (γ) tokens one after another,
then one forward pass of the model scores all γ + 1 positions and keeps the accepted
prefix plus one token of its own (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023).

- **Tokens per cycle**: with each drafted token accepted with probability α (given the
  ones before it), a cycle yields E = (1 − α^(γ+1)) / (1 − α) tokens, γ + 1 at α = 1
  (Leviathan et al. 2023, Eq. 1).
- **A cycle's time**: γ draft steps and one verify step. A draft step is a decode step of
  the drafter: ``draft_layers`` layers of the model's own shape (an EAGLE head or a
  multi-token-prediction module) with the 2·D x D matrix that joins a token's embedding
  to the last hidden state (EAGLE's FC layer, DeepSeek-V3's M_k, Sec. 2.2), its own cache,
  and the model's head. The verify step is a decode step of the model with γ + 1 tokens
  per sequence: their FLOPs, the weights read once (the routed experts that many tokens
  reach) and the cache read once.
- **TPOT** is a cycle's time over E; the memory adds the drafter's layers, its matrix and
  its cache, and γ slots per sequence in the model's cache.

The drafter's layers are the model's last kind (a mixture-of-experts layer for an MoE model,
as DeepSeek-V3's MTP module); tree drafts (EAGLE-2, Medusa) are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from costmodel.serving import terms
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import ServeSpec
from costmodel.symbols.algebra import by_symbol
from costmodel.symbols.core import Y, values_for


def tokens_per_cycle(draft_tokens: int, acceptance: float) -> float:
    """E = (1 − α^(γ+1)) / (1 − α): the tokens one draft-and-verify cycle yields
    (Leviathan et al. 2023, Eq. 1)."""
    if acceptance >= 1:
        return float(draft_tokens + 1)
    return (1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)


def drafter(model: ModelSpec, spec: ServeSpec) -> ModelSpec:
    """The drafter as a model: ``draft_layers`` layers of the model's shape (the last
    layer's kind), the model's embedding and head."""
    return model.replace(name=f"{model.name} drafter", n_layers=spec.draft_layers,
                         dense_layers=0)  # fmt: skip


def fuse_elements(model: ModelSpec) -> int:
    """Elements of the 2·D x D matrix that joins a token's embedding and the last hidden
    state, whole on every tp rank."""
    return 2 * model.d_model**2


def cycle(model: ModelSpec, spec: ServeSpec, hw: Any, step: Callable[..., dict]) -> dict:
    """One draft-and-verify cycle (module docstring) by ``step``, the decode step
    (``costmodel.serving.estimate.decode_step``): seconds and tokens."""
    gamma = spec.draft_tokens
    assert spec.acceptance is not None  # ServeSpec requires it with draft_tokens
    verify = step(model, spec, hw, per_seq=gamma + 1)["phase"]["total"]
    draft = step(drafter(model, spec), spec, hw, 1, fuse_elements(model))["phase"]["total"]
    tokens = tokens_per_cycle(gamma, spec.acceptance)
    seconds = gamma * draft + verify
    return {"time_s.speculative.draft_step": draft, "time_s.speculative.verify_step": verify,
            "time_s.speculative.cycle": seconds, "speculative.tokens_per_cycle": tokens,
            "time_s.speculative.per_token": seconds / tokens}  # fmt: skip


def extra_memory(model: ModelSpec, spec: ServeSpec, weight_bytes: int, cache: Callable) -> dict:
    """Bytes the drafter adds on a device: its layers (split over tp as the model's) and
    matrix (``weight_bytes`` per element), and per sequence (``cache(model, spec,
    tokens)``: one sequence's paged cache on a device) its own cache of the context and γ
    more slots in the model's."""
    draft = drafter(model, spec)
    layers = int(terms.block_weights(draft).xreplace(by_symbol({**values_for(draft), Y: spec.tp})))
    context = spec.context
    per_seq = (cache(draft, spec, context) + cache(model, spec, context + spec.draft_tokens)
               - cache(model, spec, context))  # fmt: skip
    return {"weights": (layers + fuse_elements(model)) * weight_bytes, "per_sequence": per_seq}
