"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2, Sec. 2.1; DeepSeek-V3,
Sec. 2.1.1): what its blocks keep for backward and what its attention core moves, in bytes.

A block projects the normed input down to a key/value latent of ``r_kv`` plus a RoPE key of
``d_r`` shared by the heads (one matmul), normalises the latent and up-projects it to every
head's key (d_h) and value (d_v); the query goes through its own ``r_q`` latent, normalised,
or one projection, to d_h + d_r per head, whose last d_r take RoPE. Query and key heads are
d_h + d_r wide; a fused kernel takes one head width, so the values are zero-padded to it
(FlashAttention-2; Hugging Face's DeepSeek models do the same) and the output sliced back.
Kept per token, as the reference model (``validate/reference/mla.py``) keeps them: each
latent (the norm's input, the whole down-projection's output whose view it is) with its
statistics, and the normed latent (the up-projection's input); in the core, the query and
key (new tensors: the RoPE part concatenated), and the fused kernel's padded values, output
and logsumexp, or the naive core's copies of query, key and value beside the probabilities;
and the out-projection's input, a copy of the sliced output. Units: bytes.
"""

from __future__ import annotations

import sympy as sp

from costmodel.single.params import head_widths
from costmodel.single.precision import STAT_BYTES, norm_kept
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols import H, L, T, b, d_h, d_r, d_v, r_kv, r_q


def saved(model: ModelSpec, train: TrainSpec, act: int, mm: int) -> dict[str, sp.Expr]:
    """An MLA block's parts of ``activation_memory`` beside its norms and input: the
    latents, the attention core and the out-projection's input, over the L blocks."""
    # each latent as its norm keeps it (the key/value one in the storage it shares with
    # the RoPE key) and normed, as its up-projection keeps it
    latents = norm_kept(model.norm, act, r_kv + d_r) + mm * r_kv
    if model.q_lora_rank:
        latents += norm_kept(model.norm, act, r_q) + mm * r_q
    d_qk = head_widths(model, train.attention)[0]
    q = act * H * d_qk
    if train.recompute == "selective":  # the checkpointed core keeps its inputs: query,
        core = 2 * q + act * H * (d_h + d_v)  # key, and the values' whole up-projection
    elif train.attention == "flash":  # query, key, padded values, output, logsumexp
        core = 4 * q + STAT_BYTES * H
    else:  # copies of query, key and values for the batched matmuls, the probabilities
        core = 2 * q + act * H * d_v + act * H * T
        if train.dropout:  # its bool mask and its output, which the PV product keeps
            core += (act + 1) * H * T
    tokens = L * b * T
    return {
        "mla_latents": tokens * latents,
        "attention": tokens * core,
        "attn_out_input": tokens * mm * H * d_v,
    }
