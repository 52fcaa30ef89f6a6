"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2, Sec. 2.1; DeepSeek-V3,
Sec. 2.1.1): its projections, what its blocks keep for backward and what its core moves.

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
and the out-projection's input, a copy of the sliced output. Under tensor parallelism the
heads split and the down-projections stay whole on every rank, over the sequence shard
under sequence parallelism (Megatron-Core's ``MLASelfAttention``: :meth:`Latent.shapes`).
Units: parameters, bytes, FLOPs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from costmodel.kinds.ops import STAT, norm_kept
from costmodel.symbols.core import D, H, L, T, Y, b, d_h, d_r, d_v, r_kv, r_q
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


class Latent:
    """MLA's latent projections around the core."""

    name = "latent"
    field = "kv_lora_rank"
    """The ModelSpec field that selects this kind (> 0)."""
    title = "MLA"
    eager = False
    """The reference model's eager op-by-op counts are not modelled for it (a spec rule)."""
    offload = False
    """Offload plans do not model its block's op sequence (its latents)."""

    def matrices(self, model: Any) -> list[tuple[str, sp.Expr, sp.Expr]]:
        """The query (through its ``r_q``-wide latent, or one projection), then ``attn_k``
        the down-projection to the key/value latent and the shared RoPE key (D -> r_kv +
        d_r), ``attn_v`` the per-head up-projection of keys and values (r_kv -> H·(d_h +
        d_v)), and O; query and key heads are d_h + d_r wide."""
        return [(op, fan_in, fan_out) for op, fan_in, fan_out, _ in self._matrices(model)]

    def _matrices(self, model: Any) -> list[tuple[str, Any, Any, str]]:
        """:meth:`matrices` with the side of each that holds the heads ("out", "in", or ""
        for the down-projections to the latents, which hold none)."""
        q_heads = H * (d_h + d_r)
        query = [("attn_q", D, r_q, ""), ("attn_q", r_q, q_heads, "out")] if (
            model.q_lora_rank) else [("attn_q", D, q_heads, "out")]  # fmt: skip
        return [*query, ("attn_k", D, r_kv + d_r, ""), ("attn_v", r_kv, H * (d_h + d_v), "out"),
                ("attn_o", H * d_v, D, "in")]  # fmt: skip

    def head_widths(self, model: Any, kernel: str) -> tuple[sp.Expr, sp.Expr]:
        """(query/key, value): d_h + d_r and d_v, the values zero-padded to the query's
        width for a fused kernel (FlashAttention-2 takes one head width)."""
        qk = d_h + d_r
        return qk, qk if kernel == "flash" else d_v

    def norm_widths(self, model: Any) -> list[sp.Expr]:
        """Its latents' norms: the key/value one's, and the query's where it has one."""
        return [r_kv, r_q] if model.q_lora_rank else [r_kv]

    def rope_width(self, model: Any) -> sp.Expr:
        """Width of the rotary tables' rows: the decoupled RoPE key's."""
        return d_r

    def shapes(
        self, model: Any, sequence_parallel: bool = False
    ) -> dict[str, list[tuple[sp.Expr, sp.Expr, sp.Expr]]]:
        """Per-device (rows per token, k, n2) of each projection under tensor parallelism Y,
        as Megatron-Core runs MLA (``MLASelfAttention``): the up-projections split by heads
        over the gathered sequence (column-parallel), O by heads (row-parallel), and the
        down-projections to the latents whole on every rank (``TELinear``,
        ``parallel_mode='duplicated'``), over the device's sequence shard under sequence
        parallelism (its 1/Y of the rows), else over the whole sequence."""
        shapes: dict[str, list[tuple[sp.Expr, sp.Expr, sp.Expr]]] = {}
        shard = 1 / Y if sequence_parallel else integer(1)
        for op, fan_in, fan_out, heads in self._matrices(model):
            if heads == "out":
                shape = (integer(1), fan_in, fan_out / Y)
            elif heads == "in":
                shape = (integer(1), fan_in / Y, fan_out)
            else:
                shape = (shard, fan_in, fan_out)
            shapes.setdefault(op, []).append(shape)
        return shapes

    def gathered_width(self, model: Any) -> sp.Expr:
        """What tensor parallelism gathers before the head-split matmuls: the query latent
        (or, without one, the block input the query projection takes), the key/value
        latent and the shared RoPE key (Megatron-Core: the up-projections' inputs and
        ``gather_from_sequence_parallel_region`` of the RoPE key)."""
        return (r_q if model.q_lora_rank else D) + r_kv + d_r

    def duplicated(self, model: Any) -> sp.Expr:
        """The down-projections to the latents: D x r_q (with a query latent) and D x
        (r_kv + d_r), whole on every tp rank."""
        return D * (r_q if model.q_lora_rank else 0) + D * (r_kv + d_r)

    def ring_widths(self, model: Any, kernel: str) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """H query and key heads of d_h + d_r, H value heads as the kernel takes them."""
        qk, value = self.head_widths(model, kernel)
        return H * qk, H * qk, H * value

    def core_traffic(self, model: Any, kernel: str, b_dev: Any, t_dev: Any, a: int) -> tuple:
        """(FLOPs per query-key pair, bytes of Q, K, V and O) on a device: heads of
        query/key and value widths (the fused kernel's padded), over tp's Y ranks."""
        d_qk, d_val = self.head_widths(model, kernel)
        per_pair = 2 * b_dev * (H / Y) * (d_qk + d_val) * t_dev / T
        return per_pair, a * b_dev * t_dev * H * (2 * d_qk + 2 * d_val) / Y

    def kept(self, model: Any, train: Any, act: int, mm: int) -> dict[str, sp.Expr]:
        """The latents, the attention core and the out-projection's input, over the L
        blocks."""
        # each latent as its norm keeps it (the key/value one in the storage it shares with
        # the RoPE key) and normed, as its up-projection keeps it
        latents = norm_kept(model.norm, act, r_kv + d_r) + mm * r_kv
        if model.q_lora_rank:
            latents += norm_kept(model.norm, act, r_q) + mm * r_q
        d_qk = self.head_widths(model, train.attention)[0]
        q = act * H * d_qk
        if train.recompute == "selective":  # the checkpointed core keeps its inputs: query,
            core = 2 * q + act * H * (d_h + d_v)  # key, and the values' whole up-projection
        elif train.attention == "flash":  # query, key, padded values, output, logsumexp
            core = 4 * q + STAT * H
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

    def cached(self, model: Any) -> sp.Expr:
        """The key/value latent and the shared RoPE key, r_kv + d_r per token (DeepSeek-V2,
        Sec. 2.1.1: 512 + 64 for V2 and V3), whole on every tp rank (the heads are made from
        it on each)."""
        return r_kv + d_r

    def decode_widths(self, model: Any) -> tuple[sp.Expr, sp.Expr]:
        """With the up-projections absorbed (DeepSeek-V2, Sec. 2.1.2; FlashMLA), a query head
        scores the r_kv + d_r-wide cache entries and sums the r_kv-wide latents."""
        return r_kv + d_r, r_kv

    def split_shares(self, model: Any) -> list[Any]:
        """Per matrix of :meth:`matrices`, the share one of tp's Y ranks holds when
        serving: 1/Y of those with heads, the down-projections to the latents whole."""
        return [1 / Y if heads else 1 for *_, heads in self._matrices(model)]


LATENT = Latent()
