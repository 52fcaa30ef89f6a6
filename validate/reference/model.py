"""The reference model (DESIGN.md), built from any ``costmodel.ModelSpec``.

Pre-norm decoder LM: token embedding (+ learned positions), L blocks of
``x + attn(norm(x))`` and ``x + ffn(norm(x))``, final norm, LM head (tied or untied),
cross-entropy in fp32. Causal attention with H query and K key/value heads and RoPE; with a
sliding window, local blocks see only the window's keys (``ModelSpec.is_local``).
FFN-only specs (the Scaling Book's XXL) keep only ``x + W2 σ(W1 x)`` per block.

Mixed precision is explicit rather than ``torch.autocast``: parameters keep their dtype,
each linear casts its weight to the compute dtype (autocast's rule for matmuls) and block
inputs are cast once. The numerics equal autocast's, and unlike autocast the casts also
happen on the ``meta`` device, so ``validate/probes/accounting.py`` can count them at full scale.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from torch.utils.flop_counter import (
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop,
    sdpa_flop,
)

from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.rules import check_positions
from validate.reference.core import attend, attention_masks
from validate.reference.lora import apply_finetuning
from validate.reference.mla import MLAttention
from validate.reference.moe import MoE
from validate.reference.norms import LayerNorm, RMSNorm

DTYPES = {  # precision -> (parameter dtype, compute dtype)
    "fp32": (torch.float32, torch.float32),
    "tf32": (torch.float32, torch.float32),
    "bf16-mixed": (torch.float32, torch.bfloat16),
    "fp16-mixed": (torch.float32, torch.float16),
    "bf16": (torch.bfloat16, torch.bfloat16),
}

# torch counts the CUDA fused attention ops but not the CPU one that SDPA dispatches to;
# count it with torch's own formulas so CPU and meta runs are counted like CUDA runs.
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CPU_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
if _CPU_FLASH not in flop_registry:
    # sdpa_flop and sdpa_backward_flop are already wrapped to receive shapes.
    register_flop_formula(_CPU_FLASH, get_raw=True)(sdpa_flop)
    register_flop_formula(_CPU_FLASH_BWD, get_raw=True)(sdpa_backward_flop)


_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
_FUSED_ATTENTION = {  # every fused SDPA kernel torch dispatches to, CPU's included
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(torch.ops.aten, name)
} | {_CPU_FLASH.default}
RECOMPUTE_POLICIES = ("none", "full", "selective", "selective-op")


def op_level_contexts():
    """torchtitan's op-level selective activation checkpointing for one block's forward.

    Saves the outputs of the fused attention kernel and of every odd-numbered matmul
    (1st, 3rd, ...) in the block's forward order; recomputes everything else in backward
    (torchtitan ``activation_checkpoint.mode = "selective"``, ``selective_ac_option = "op"``,
    ``_save_list`` and "every second mm" rule, torchtitan@31a17bf,
    ``parallelisms/parallelize_llama.py``). Counts ``addmm`` as a matmul too, so biased
    projections follow the same rule (torchtitan's models have none). Counters restart per
    block and per pass, so the recompute makes the same choices as the forward.
    """
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func in _MATMULS:
            counts[mode] += 1
            save = counts[mode] % 2 == 1
        else:
            save = func in _FUSED_ATTENTION
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def dtypes_for(precision: str) -> tuple[torch.dtype, torch.dtype]:
    """(parameter dtype, compute dtype) of a costmodel precision."""
    if precision not in DTYPES:
        raise ValueError(
            f"precision must be one of {', '.join(DTYPES)} for the reference model "
            f"(got {precision!r}; fp8 is modelled by costmodel but not run)"
        )
    return DTYPES[precision]


class Linear(nn.Linear):
    """y = x Wᵀ (+ b) with W cast to the compute dtype, as autocast does for matmuls.

    An ``nn.Linear``, so torch's tensor-parallel styles (Colwise/RowwiseParallel) apply.
    """

    def __init__(self, fan_in: int, fan_out: int, bias: bool, compute: torch.dtype, **factory):
        super().__init__(fan_in, fan_out, bias=bias, **factory)
        self.compute = compute

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.in_features**-0.5)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(self.compute)
        return F.linear(x, self.weight.to(self.compute), bias)


def rope_tables(
    seq: int, dim: int, dtype: torch.dtype, device, base: float = 10000.0, start: int = 0
):
    """cos and sin of shape (seq, dim) for positions start.. (Su et al. 2021, RoFormer,
    Eq. 34; rotate-half form)."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    positions = torch.arange(start, start + seq, device=device, dtype=torch.float32)
    freqs = torch.outer(positions, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (b, T, heads, d) pairs; keeps only cos and sin for backward."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None, :] + torch.cat((-x2, x1), dim=-1) * sin[:, None, :]


def dropout(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """Dropout as CUDA runs it on every device: ``native_dropout`` keeps a bool mask for
    backward (``F.dropout`` off CUDA multiplies by a mask in the input's dtype)."""
    return torch.native_dropout(x, p, train)[0]


class NaiveAttention(nn.Module):
    """softmax(QKᵀ/√d + mask) V with the T x T scores and probabilities materialised,
    the probabilities dropped out with probability ``dropout``."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, q, k, v, mask):
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        if self.dropout:
            probs = dropout(probs, self.dropout, self.training)
        return probs @ v


class FlashAttention(nn.Module):
    """Fused causal attention: keeps Q, K, V, O and the logsumexp (Dao 2023); given a local
    layer's additive band ``mask`` instead, that mask too.

    CUDA takes SDPA's dispatch (FlashAttention-2 or memory-efficient kernels), which draws
    the dropout mask inside the kernel; CPU and meta call the CPU flash kernel directly,
    since SDPA on ``meta`` falls back to the math path, and it has no dropout.
    """

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, q, k, v, mask):
        p = self.dropout if self.training else 0.0
        width = v.shape[-1]  # narrower values (MLA) are padded to the kernel's one width
        if width != q.shape[-1]:
            v = F.pad(v, (0, q.shape[-1] - width))
        if q.device.type == "cuda":
            gqa = q.shape[1] != k.shape[1]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                               is_causal=mask is None, enable_gqa=gqa)  # fmt: skip
        elif p:
            raise ValueError(
                "attention dropout in the flash kernel runs on CUDA only "
                "(use attention='naive' or dropout=0 on CPU)"
            )
        else:
            o = _CPU_FLASH(q, k, v, 0.0, mask is None, attn_mask=mask)[0]
        return o[..., :width] if width != q.shape[-1] else o


class Attention(nn.Module):
    def __init__(
        self, spec: ModelSpec, compute: torch.dtype, kernel: str, selective: bool, dropout, **fk
    ):
        super().__init__()
        hd, qkv_bias = spec.head_dim, spec.bias or spec.qkv_bias
        self.spec, self.selective = spec, selective
        self.q = Linear(spec.d_model, spec.n_heads * hd, qkv_bias, compute, **fk)
        self.k = Linear(spec.d_model, spec.n_kv_heads * hd, qkv_bias, compute, **fk)
        self.v = Linear(spec.d_model, spec.n_kv_heads * hd, qkv_bias, compute, **fk)
        self.o = Linear(spec.n_heads * hd, spec.d_model, spec.bias, compute, **fk)
        self.core = NaiveAttention(dropout) if kernel == "naive" else FlashAttention(dropout)
        if spec.qk_norm:  # one gain over d_h for each, shared by the heads (Qwen3)
            self.q_norm, self.k_norm = _norm(spec, hd, **fk), _norm(spec, hd, **fk)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        s = self.spec
        # -1 heads: under tensor parallelism each rank holds a slice of them
        q = self.q(x).view(b, t, -1, s.head_dim)
        k = self.k(x).view(b, t, -1, s.head_dim)
        if s.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v(x).view(b, t, -1, s.head_dim)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return attend(self.core, self.selective, q, k, v, mask, self.o)


class FFN(nn.Module):
    """SwiGLU W2(silu(W1 x) ⊙ W3 x) (Shazeer 2020), or W2 σ(W1 x) with GELU / ReLU."""

    def __init__(self, spec: ModelSpec, compute: torch.dtype, width: int | None = None, **fk):
        super().__init__()
        self.kind, width = spec.ffn, width or spec.d_ff
        self.w1 = Linear(spec.d_model, width, spec.bias, compute, **fk)
        self.w2 = Linear(width, spec.d_model, spec.bias, compute, **fk)
        if spec.ffn == "swiglu":
            self.w3 = Linear(spec.d_model, width, spec.bias, compute, **fk)

    def forward(self, x):
        if self.kind == "swiglu":
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        act = F.gelu if self.kind == "gelu" else F.relu
        return self.w2(act(self.w1(x)))


def _norm(spec: ModelSpec, width: int | None = None, **fk) -> nn.Module:
    width = width or spec.d_model
    return RMSNorm(width, **fk) if spec.norm == "rmsnorm" else LayerNorm(width, **fk)


class Block(nn.Module):
    def __init__(
        self, spec: ModelSpec, compute, kernel: str, selective: bool, dropout: float,
        moe: bool = False, local: bool = False, **fk,
    ):  # fmt: skip
        super().__init__()
        self.compute, self.ffn_only, self.dropout = compute, spec.ffn_only, dropout
        self.local = local  # a sliding-window block (``ModelSpec.is_local``)
        self.parallel = spec.parallel_block
        if not spec.ffn_only:
            self.norm1 = _norm(spec, **fk)
            self.norm2 = None if spec.parallel_block else _norm(spec, **fk)
            if spec.mla:
                core = NaiveAttention(dropout) if kernel == "naive" else FlashAttention(dropout)
                self.attn = MLAttention(spec, compute, core, selective, Linear, _norm,
                                        apply_rope, **fk)  # fmt: skip
            else:
                self.attn = Attention(spec, compute, kernel, selective, dropout, **fk)
        self.ffn = MoE(spec, compute, FFN, Linear, **fk) if moe else FFN(spec, compute, **fk)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout on a residual branch's output (keeps a bool mask for backward)."""
        return dropout(x, self.dropout, self.training) if self.dropout else x

    def forward(self, x, cos, sin, mask):
        if self.ffn_only:
            return x + self._drop(self.ffn(x.to(self.compute)))
        if self.parallel:  # one normed input to both branches, summed into the residual
            h = self.norm1(x).to(self.compute)
            return x + self._drop(self.attn(h, cos, sin, mask)) + self._drop(self.ffn(h))
        x = x + self._drop(self.attn(self.norm1(x).to(self.compute), cos, sin, mask))
        return x + self._drop(self.ffn(self.norm2(x).to(self.compute)))


class TransformerLM(nn.Module):
    """The reference LM; ``forward(batch)`` returns the mean cross-entropy (fp32 scalar).

    ``batch`` is ``(ids, targets)`` of int64 (b, T), or for FFN-only specs a (b, T, D)
    activation tensor whose output is summed into the scalar.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        precision: str = "fp32",
        attention: str = "flash",
        recompute: str = "none",
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        recompute_every: int = 1,
    ) -> None:
        super().__init__()
        if attention not in ("naive", "flash"):
            raise ValueError(f"attention must be naive or flash (got {attention!r})")
        if recompute not in RECOMPUTE_POLICIES:
            raise ValueError(
                f"recompute must be one of {', '.join(RECOMPUTE_POLICIES)} (got {recompute!r})"
            )
        param_dtype, self.compute = dtypes_for(precision)
        self.spec, self.attention, self.recompute = spec, attention, recompute
        self.recompute_every = recompute_every  # full: checkpoint blocks i % n == 0 only
        self.dropout, self.finetune = dropout, "full"
        fk = {"device": device, "dtype": param_dtype}
        self.blocks = nn.ModuleList(
            Block(spec, self.compute, attention, recompute == "selective", dropout,
                  moe=spec.moe and i >= spec.dense_layers, local=spec.is_local(i), **fk)
            for i in range(spec.n_layers)
        )  # fmt: skip
        if spec.ffn_only:
            return
        self.embed = nn.Embedding(spec.vocab, spec.d_model, **fk)
        if spec.pos == "learned":
            self.pos = nn.Embedding(spec.max_positions, spec.d_model, **fk)
        self.norm_f = _norm(spec, **fk)
        self.lm_head = Linear(spec.d_model, spec.vocab, False, self.compute, **fk)
        if spec.tied:
            self.lm_head.weight = self.embed.weight

    @classmethod
    def for_training(cls, spec: ModelSpec, train: TrainSpec, device=None) -> TransformerLM:
        """The model a TrainSpec describes (precision, attention kernel, recomputation,
        fine-tuning: frozen weights, adapters, NF4 block matrices)."""
        model = cls(
            spec,
            precision=train.precision,
            attention=train.attention,
            recompute=train.recompute,
            dropout=train.dropout,
            device=device,
            recompute_every=train.recompute_every,
        )
        if train.finetune != "full":
            apply_finetuning(model, train, Linear, model.compute)
            model.finetune = train.finetune
        return model

    def forward(self, batch) -> torch.Tensor:
        if self.spec.ffn_only:
            return self._run_blocks(batch, None, None, None).float().sum()
        ids, targets = batch
        x = self._embed(ids)
        x = self._run_blocks(x, *self._tables(ids.shape[1], ids.device))
        logits = self.lm_head(self.norm_f(x).to(self.compute))
        return F.cross_entropy(logits.float().view(-1, self.spec.vocab), targets.view(-1))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.spec.pos == "learned":
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        if self.finetune != "full" and torch.is_grad_enabled():
            # frozen embeddings: the blocks' adapters still need their inputs' gradients
            # (PEFT's enable_input_require_grads)
            x.requires_grad_()
        return x

    def _tables(self, t: int, device) -> tuple:
        """(cos, sin, masks) the blocks take: RoPE tables, the global and local layers' masks."""
        cos = sin = None
        if self.spec.pos == "rope":  # MLA rotates its decoupled part alone
            width = self.spec.rope_head_dim if self.spec.mla else self.spec.head_dim
            cos, sin = rope_tables(t, width, self.compute, device)
        local, window = [block.local for block in self.blocks], self.spec.sliding_window
        return cos, sin, attention_masks(self.attention, local, window, t, self.compute, device)

    def _run_blocks(self, x, cos, sin, masks):
        for i, block in enumerate(self.blocks):
            mask = None if masks is None else masks[block.local]
            every = self.recompute_every if self.recompute == "full" else 1
            if self.recompute in ("full", "selective-op") and i % every == 0:
                context = {"context_fn": op_level_contexts} if self.recompute != "full" else {}
                x = checkpoint(
                    block,
                    x,
                    cos,
                    sin,
                    mask,
                    use_reentrant=False,
                    preserve_rng_state=self.dropout > 0,
                    **context,
                )
            else:
                x = block(x, cos, sin, mask)
        return x


def make_batch(model: TransformerLM, batch: int, seq: int, device=None, generator=None):
    """Random token ids and targets, or for FFN-only models an input that requires grad."""
    spec = model.spec
    check_positions(spec.pos, seq, spec.max_positions)
    if spec.ffn_only:
        dtype = next(model.parameters()).dtype
        x = torch.randn(batch, seq, spec.d_model, device=device, dtype=dtype, generator=generator)
        return x.requires_grad_()
    shape = (batch, seq)
    ids = torch.randint(spec.vocab, shape, device=device, generator=generator)
    return ids, torch.randint(spec.vocab, shape, device=device, generator=generator)
