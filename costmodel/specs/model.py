"""Model and training specifications: frozen, keyword-only, validated dataclasses.

Every field is documented where it is declared; choices are ``Literal`` types (the CLI's
flags and the app's widgets read them from here). Validation raises
:class:`~costmodel.specs.checks.SpecError` naming the field and the constraint, so a CLI or
app can show it verbatim. The rules between fields are functions of plain values
(:mod:`costmodel.specs.rules`) so that ``costmodel.config.check`` applies the same ones to
numpy grids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import numpy as np

from costmodel.specs import checks
from costmodel.specs.attention import is_local, window_rules
from costmodel.specs.checks import SpecError
from costmodel.specs.fields import check_fields, choices_of, document_fields, field_docs
from costmodel.specs.rules import (
    derived_head_dim,
    model_rules,
    moe_rules,
    train_rules,
)

FfnKind = Literal["swiglu", "gelu", "relu"]
NormKind = Literal["rmsnorm", "layernorm"]
PosKind = Literal["rope", "learned"]
PrecisionName = Literal["fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16", "fp8"]
OptimizerName = Literal["adamw", "adam", "sgd", "sgd-momentum", "none"]
OptimizerImpl = Literal["foreach", "fused"]
Elementwise = Literal["fused", "eager"]
AttentionKernel = Literal["naive", "flash"]
FlashFamily = Literal["auto", "fa2", "fa3", "cudnn", "triton-2022"]
Fp8Recipe = Literal["tensorwise", "rowwise", "blockwise", "mxfp8"]
RecomputePolicy = Literal["none", "full", "selective", "selective-op"]
Finetune = Literal["full", "lora", "qlora"]
LoraTargets = Literal["all-linear", "attention", "qv"]

FFN_KINDS: tuple[str, ...] = get_args(FfnKind)
NORM_KINDS: tuple[str, ...] = get_args(NormKind)
POS_KINDS: tuple[str, ...] = get_args(PosKind)
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
OPTIMIZER_IMPLS: tuple[str, ...] = get_args(OptimizerImpl)
ATTENTION_KERNELS: tuple[str, ...] = get_args(AttentionKernel)
RECOMPUTE_POLICIES: tuple[str, ...] = get_args(RecomputePolicy)
FINETUNES: tuple[str, ...] = get_args(Finetune)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer LM (or an FFN-only stack, as the Scaling Book's XXL)."""

    name: str = "custom"
    """Label used in reports; has no effect on any number."""
    vocab: int
    """Vocabulary size V (rows of the embedding). Must be 0 for ``ffn_only`` stacks."""
    d_model: int
    """Residual width D."""
    n_layers: int
    """Number of blocks L."""
    n_heads: int
    """Query heads H."""
    n_kv_heads: int | None = None
    """Key/value heads K (GQA; 1 is MQA). Defaults to ``n_heads`` (MHA)."""
    head_dim: int | None = None
    """Per-head width; defaults to ``d_model // n_heads``. Under MLA, the width of each
    query and key head's part without position (DeepSeek's ``qk_nope_head_dim``)."""
    d_ff: int
    """FFN hidden width F."""
    ffn: FfnKind = "swiglu"
    """``swiglu`` (three matrices, SiLU gate), ``gelu`` or ``relu`` (two matrices)."""
    norm: NormKind = "rmsnorm"
    """``rmsnorm`` (weight only) or ``layernorm`` (weight and bias)."""
    bias: bool = False
    """Biases on every linear layer (GPT-2/GPT-3 style)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections only (Qwen2 style); implied by ``bias``."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2, Sec. 2.1): each
    token's keys and values are up-projected per head from one latent of this width, shared
    by the heads (normalised before the up-projection), beside a ``rope_head_dim``-wide
    RoPE key shared by the heads; 0: standard attention."""
    q_lora_rank: int = 0
    """Under MLA, the width of the query's low-rank bottleneck (normalised; DeepSeek-V2,
    Eq. 12); 0: one full-rank query projection."""
    rope_head_dim: int = 0
    """Under MLA, each query head's and the shared key's decoupled RoPE part (DeepSeek-V2,
    Sec. 2.1.3): query and key heads are ``head_dim + rope_head_dim`` wide."""
    v_head_dim: int | None = None
    """Per-head value width; defaults to ``head_dim`` (only MLA sets another)."""
    qk_norm: bool = False
    """A norm of kind ``norm`` over each head's query and key, before RoPE, with one d_h
    gain (and bias) for each of the two shared by the heads (Qwen3; Dehghani et al. 2023,
    "Scaling Vision Transformers to 22 Billion Parameters", Sec. 3.1)."""
    parallel_block: bool = False
    """Attention and the FFN read one normed input side by side and their outputs are summed
    into the residual stream (GPT-J; PaLM, Chowdhery et al. 2022, Sec. 2; Falcon; MaxText's
    2023 decoder): one norm per block, the normed input kept once for both, and one
    tensor-parallel reduction per block in place of two."""
    tied: bool = False
    """LM head shares the token-embedding matrix."""
    pos: PosKind = "rope"
    """``rope`` (no parameters) or ``learned`` (a ``max_positions`` x D table)."""
    max_positions: int = 2048
    """Context length the model supports; sizes the learned position table."""
    ffn_only: bool = False
    """Blocks are the FFN alone: no attention, norms, embedding or LM head (Scaling Book XXL)."""
    n_experts: int = 0
    """Routed experts per mixture-of-experts layer; 0: every FFN is dense."""
    experts_per_token: int = 0
    """Routed experts each token runs (token-choice top-k, dropless); 1..n_experts."""
    d_ff_expert: int | None = None
    """Hidden width of one expert's FFN (same kind as ``ffn``); defaults to ``d_ff``; unused
    by a dense model."""
    n_shared_experts: int = 0
    """Experts of width ``d_ff_expert`` every token runs besides the routed ones
    (DeepSeekMoE's shared experts)."""
    dense_layers: int = 0
    """Leading blocks whose FFN is dense, of width ``d_ff`` (DeepSeek-V3's
    ``first_k_dense_replace``)."""
    expert_groups: int = 0
    """Groups the routed experts form for group-limited routing, E / G adjacent experts each
    (DeepSeek-V2/V3's ``n_group``: V3's 8 groups of 32, a node's experts in its deployment);
    0: no groups. Only where a token's experts travel (``costmodel.kinds.routing``)."""
    groups_per_token: int = 0
    """Groups a token's experts may come from under group-limited routing (``topk_group``:
    V3 4 of 8, V2 3 of 8; DeepSeek-AI 2024, V2 Sec. 2.1.2 device-limited routing, V3 Sec.
    2.1.2 node-limited routing, 'each token will be sent to at most M nodes'); 0: any."""
    shared_expert_gate: bool = False
    """The shared experts' output scaled per token by a sigmoid gate, a bias-free D -> 1
    linear (Qwen2-MoE's ``shared_expert_gate``)."""
    moe_renormalize: bool = True
    """Each token's top-k router probabilities renormalised to sum to 1 (Mixtral,
    DeepSeekMoE, Qwen3-MoE's ``norm_topk_prob``); false weights the experts by the
    softmax's own values (Qwen2-MoE)."""
    sliding_window: int = 0
    """Keys each query sees in a local layer, itself included (keys j with i - W < j <= i;
    Mistral 7B, Jiang et al. 2023, Sec. 2); 0: every layer is global (full causal)."""
    global_every: int = 0
    """With a window, every ``global_every``-th layer (1-based) is global and the rest local
    (Gemma 2 and gpt-oss: 2; Gemma 3: 6); 0: every layer local (Mistral-7B v0.1)."""

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        sizes = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_positions")
        flags = ("bias", "qkv_bias", "qk_norm", "tied", "ffn_only", "parallel_block")
        check_fields(self, sizes, flags)
        checks.integer("vocab", self.vocab, minimum=0)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", derived_head_dim(self.d_model, self.n_heads))
        checks.integer("head_dim", self.head_dim)
        self._check_latent_attention()
        model_rules(
            n_heads=self.n_heads, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim, pos=self.pos
        )
        self._check_experts()
        checks.integer("sliding_window", self.sliding_window, minimum=0)
        checks.integer("global_every", self.global_every, minimum=0)
        window_rules(self)
        for flag in ("qk_norm", "parallel_block"):
            if self.ffn_only and getattr(self, flag):
                raise SpecError(flag, f"{flag} needs attention (ffn_only is set)")
        if self.ffn_only and self.vocab != 0:
            raise SpecError("vocab", f"vocab must be 0 for an ffn_only model (got {self.vocab})")
        if not self.ffn_only and self.vocab == 0:
            raise SpecError("vocab", "vocab must be >= 1 (got 0)")

    def _check_latent_attention(self) -> None:
        """MLA's widths: all zero (and the value heads as wide as the others) without it;
        with it, one key/value head per query head, RoPE, and no biases or QK-norm."""
        for name in ("kv_lora_rank", "q_lora_rank", "rope_head_dim"):
            checks.integer(name, getattr(self, name), minimum=0)
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        checks.integer("v_head_dim", self.v_head_dim)
        if not self.mla:
            for name in ("q_lora_rank", "rope_head_dim"):
                if getattr(self, name):
                    raise SpecError(name, f"{name} needs kv_lora_rank >= 1 (MLA)")
            if self.v_head_dim != self.head_dim:
                raise SpecError("v_head_dim", f"v_head_dim must equal head_dim = "
                                f"{self.head_dim} without MLA (got {self.v_head_dim})")  # fmt: skip
            return
        for name, ok, why in (
            ("n_kv_heads", self.n_kv_heads == self.n_heads, "must equal n_heads"),
            ("rope_head_dim", self.rope_head_dim >= 2 and self.rope_head_dim % 2 == 0,
             "must be even and >= 2"),
            ("pos", self.pos == "rope", "must be rope"),
            ("qkv_bias", not (self.bias or self.qkv_bias), "must be off (no biases)"),
            ("qk_norm", not self.qk_norm, "must be off"),
            ("parallel_block", not self.parallel_block, "must be off"),
            ("ffn_only", not self.ffn_only, "must be off"),
        ):  # fmt: skip
            if not ok:
                raise SpecError(name, f"under MLA (kv_lora_rank > 0), {name} {why}")

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention."""
        return self.kv_lora_rank > 0

    def _check_experts(self) -> None:
        """Mixture-of-experts fields: all zero for a dense model; with routed experts,
        top-k within the experts and the dense leading layers fewer than all."""
        for name in (
            "n_experts",
            "experts_per_token",
            "n_shared_experts",
            "dense_layers",
            "expert_groups",
            "groups_per_token",
        ):
            checks.integer(name, getattr(self, name), minimum=0)
        checks.flag("shared_expert_gate", self.shared_expert_gate)
        checks.flag("moe_renormalize", self.moe_renormalize)
        if self.shared_expert_gate and not self.n_shared_experts:
            raise SpecError("shared_expert_gate", "shared_expert_gate needs n_shared_experts >= 1")
        if not self.n_experts:
            if self.d_ff_expert is not None:  # given, though unused: still a width
                checks.integer("d_ff_expert", self.d_ff_expert)
            for name in (
                "experts_per_token",
                "n_shared_experts",
                "dense_layers",
                "expert_groups",
                "groups_per_token",
            ):
                if getattr(self, name):
                    raise SpecError(name, f"{name} needs n_experts >= 1 (got n_experts 0)")
            if not self.moe_renormalize:
                raise SpecError("moe_renormalize", "moe_renormalize=false needs n_experts >= 1")
            return
        if self.d_ff_expert is None:
            object.__setattr__(self, "d_ff_expert", self.d_ff)
        checks.integer("d_ff_expert", self.d_ff_expert)
        moe_rules(self)
        self._check_groups()
        if self.ffn_only:
            raise SpecError("n_experts", "mixture-of-experts blocks need attention (ffn_only)")

    def _check_groups(self) -> None:
        """Group-limited routing: both fields or neither; the groups divide the experts,
        a token takes 1..G of them, and its k experts fit the groups it may take."""
        groups, chosen = self.expert_groups, self.groups_per_token
        if bool(groups) != bool(chosen):
            given = "expert_groups" if groups else "groups_per_token"
            raise SpecError(given, "group-limited routing needs expert_groups and "
                            "groups_per_token, both >= 1 (or neither)")  # fmt: skip
        if not groups:
            return
        checks.divides("expert_groups", groups, "n_experts", self.n_experts)
        if chosen > groups:
            raise SpecError("groups_per_token", f"groups_per_token ({chosen}) must be <= "
                            f"expert_groups ({groups})")  # fmt: skip
        room = chosen * self.n_experts // groups
        if self.experts_per_token > room:
            raise SpecError("groups_per_token", f"experts_per_token ({self.experts_per_token}) "
                            f"must fit the {chosen} group(s) a token may take ({room} "
                            "experts)")  # fmt: skip

    @property
    def moe(self) -> bool:
        """Whether some FFNs are mixtures of experts."""
        return self.n_experts > 0

    def is_local(self, layer: int) -> bool:
        """Whether block ``layer`` (0-based) attends through the sliding window."""
        return is_local(layer, self.sliding_window, self.global_every)

    def replace(self, **changes: Any) -> ModelSpec:
        """A copy with ``changes`` applied and validated again; unknown fields are an error."""
        return _replace(self, changes)


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """One optimizer step of training on one device (sharding is a separate spec)."""

    batch: int = 4
    """Sequences per optimizer step (split into ``grad_accum`` micro-batches)."""
    seq: int = 1024
    """Tokens per sequence T."""
    precision: PrecisionName = "bf16-mixed"
    """``fp32`` (IEEE fp32 matmuls, torch's default), ``tf32``, ``bf16-mixed``/``fp16-mixed``
    (fp32 parameters, low-precision compute, as torch.autocast), ``bf16`` (everything bf16),
    ``fp8`` (fp8 matmul operands, bf16 activations, fp32 master; modelled, not validated)."""
    optimizer: OptimizerName = "adamw"
    """``adamw``/``adam`` (two states), ``sgd-momentum`` (one), ``sgd`` or ``none`` (no state)."""
    optimizer_impl: OptimizerImpl = "foreach"
    """``foreach`` (torch's multi-tensor kernels: one pass over memory per elementwise op,
    torch's default on GPU) or ``fused`` (one kernel reads and writes each tensor once)."""
    attention: AttentionKernel = "flash"
    """``naive`` materialises the T x T probabilities; ``flash`` saves only O and logsumexp."""
    attention_kernel: FlashFamily = "auto"
    """Which fused kernel runs ``flash`` attention: ``auto`` (the device's default: what
    torch's SDPA picks), ``fa2`` (FlashAttention-2), ``fa3`` (FlashAttention-3, Hopper),
    ``cudnn`` (cuDNN's fused attention) or ``triton-2022`` (the 2022 Triton FlashAttention
    MosaicML's MPT runs used); its speed is the hardware profile's ``attention_kernels``."""
    elementwise: Elementwise = "fused"
    """``fused`` (torch.compile or hand-fused kernels, as Megatron and Transformer Engine
    ship: one read and write of what the forward keeps) or ``eager`` (PyTorch eager: every
    elementwise op a kernel of its own, counted op by op in ``single/elementwise.py``)."""
    fp8_recipe: Fp8Recipe = "tensorwise"
    """How fp8 GEMM operands are scaled (``precision="fp8"`` only): ``tensorwise`` (one scale
    per tensor: Transformer Engine's delayed/current scaling, torchao's default),
    ``rowwise`` (per row and column: torchao/torchtitan), ``blockwise`` (1x128 and 128x128
    blocks: DeepSeek-V3, TE's ``Float8BlockScaling``) or ``mxfp8`` (an E8M0 scale per 32
    values: TE's ``MXFP8BlockScaling``, on Blackwell and CDNA 4); each GEMM's rate in
    ``single/fp8.py``."""
    recompute: RecomputePolicy = "none"
    """``none``; ``full`` checkpoints every block; ``selective`` checkpoints the attention core
    (Korthikanti et al. 2022, Sec. 4.2); ``selective-op`` checkpoints every block but saves
    the fused attention outputs and every second matmul output (torchtitan's op-level
    selective AC, ``selective_ac_option = "op"``)."""
    recompute_every: int = 1
    """With ``recompute="full"``, checkpoint every n-th block only (those whose index is a
    multiple of n: ceil(L / n) of the L blocks; torchtitan's ``selective_ac_option = "n"``,
    IBM's fms-fsdp ``selective_checkpointing = 1/n``, Megatron's ``--recompute-num-layers``
    of each stage); the others keep their activations. 1: every block."""
    dropout: float = 0.0
    """Dropout probability on each residual branch's output and on the attention
    probabilities (GPT-2 and Megatron's ``--hidden-dropout``/``--attention-dropout``, 0.1
    there); 0 for Llama-style training. Fused attention kernels draw the attention mask
    inside the kernel (FlashAttention, Dao et al. 2022, Alg. 1)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; must divide ``batch``."""
    finetune: Finetune = "full"
    """``full`` trains every weight; ``lora`` freezes the model's weights, stored in the
    compute dtype with no gradient or optimizer state, and trains a rank-``lora_rank``
    adapter B·A beside each of the ``lora_targets`` matrices (Hu et al. 2021, LoRA, Sec.
    4.1); ``qlora`` also stores the frozen block matrices in 4-bit NF4 with double-quantized
    constants, dequantized to the compute dtype for each matmul (Dettmers et al. 2023,
    QLoRA, Sec. 3)."""
    lora_rank: int = 16
    """Rank r of each LoRA adapter (A is r x fan-in, B fan-out x r); unused by ``full``."""
    lora_targets: LoraTargets = "all-linear"
    """The block matrices that get adapters: ``all-linear`` (Q, K, V, O and the FFN's, as
    QLoRA and PEFT's ``target_modules="all-linear"``), ``attention`` (Q, K, V, O) or ``qv``
    (Q and V, the LoRA paper's choice); unused by ``full``."""

    def __post_init__(self) -> None:
        check_fields(self, ("batch", "seq", "grad_accum", "lora_rank", "recompute_every"))
        checks.number("dropout", self.dropout, allow_zero=True)
        if not self.dropout < 1:
            raise SpecError("dropout", f"dropout must be below 1 (got {self.dropout})")
        train_rules(batch=self.batch, grad_accum=self.grad_accum)
        if np.any(np.asarray(self.fp8_recipe) != "tensorwise") and self.precision != "fp8":
            raise SpecError("fp8_recipe", f"fp8_recipe {self.fp8_recipe} scales fp8 GEMMs: it "
                            f"needs precision fp8 (got {self.precision})")  # fmt: skip

    @property
    def micro_batch(self) -> int:
        """Sequences in one forward/backward pass of the whole batch, over every replica
        (batch / grad_accum): 8 for fsdp 8 at one sequence a device. Per device, as the
        CLI's ``--microbatch``, a plan's rows and ``sweep(micro_batch=...)`` count it, it is
        this over the data-parallel ranks, dp x fsdp (``engine.nearest.micro_per_device``)."""
        return self.batch // self.grad_accum

    def replace(self, **changes: Any) -> TrainSpec:
        """A copy with ``changes`` applied and validated again; unknown fields are an error."""
        return _replace(self, changes)


def _replace(spec: Any, changes: dict[str, Any]) -> Any:
    known = {f.name for f in fields(spec)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise SpecError(unknown[0], f"unknown {type(spec).__name__} field(s): {', '.join(unknown)}")
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    if isinstance(spec, ModelSpec):
        values.update(dict.fromkeys(followers(spec, changes)))  # derived when built
        if changes.get("n_experts") == 0:  # a dense model has no expert width or groups
            for name, none in (("d_ff_expert", None), ("expert_groups", 0),
                               ("groups_per_token", 0)):  # fmt: skip
                if name not in changes:
                    values[name] = none
        if changes.get("sliding_window") == 0 and "global_every" not in changes:
            values["global_every"] = 0  # no window, no pattern of windowed layers
    values.update(changes)
    return type(spec)(**values)


def _same(value: Any) -> Any:
    return value


DERIVED: tuple[tuple[str, tuple[str, ...], Any], ...] = (
    ("head_dim", ("d_model", "n_heads"), derived_head_dim),
    ("n_kv_heads", ("n_heads",), _same),
    ("v_head_dim", ("head_dim",), _same),
    ("d_ff_expert", ("d_ff",), _same),
)
"""Derived defaults, in order: (field, the fields it derives from, how). A field left
unset is derived when the spec is built; a field that a base spec derived follows what it
derives from when that changes, unless given too (``ModelSpec.replace``, ``sweep``)."""


def _derives_to(base: ModelSpec, name: str, sources: tuple[str, ...], rule: Any) -> bool:
    try:
        return getattr(base, name) == rule(*(getattr(base, s) for s in sources))
    except SpecError:  # e.g. n_heads does not divide d_model: head_dim was set explicitly
        return False


def followers(base: ModelSpec, given: Mapping[str, Any]) -> list[str]:
    """The derived fields of ``base`` that follow the ``given`` changes, in ``DERIVED``'s
    order: each one not given whose sources changed (or follow) and whose value in
    ``base`` is what it derives to there (a value set explicitly, e.g. Qwen3's head_dim,
    stays)."""
    out: list[str] = []
    for name, sources, rule in DERIVED:
        changed = any(s in given or s in out for s in sources)
        if name not in given and changed and _derives_to(base, name, sources, rule):
            out.append(name)
    return out


def following(base: ModelSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """The values of :func:`followers` derived from ``given`` (scalars or numpy arrays)."""
    out: dict[str, Any] = {}
    rules = {name: (sources, rule) for name, sources, rule in DERIVED}
    for name in followers(base, given):
        sources, rule = rules[name]
        out[name] = rule(*(out.get(s, given.get(s, getattr(base, s))) for s in sources))
    return out


document_fields(ModelSpec)
document_fields(TrainSpec)

__all__ = [
    "ModelSpec",
    "SpecError",
    "TrainSpec",
    "check_fields",
    "choices_of",
    "document_fields",
    "field_docs",
]
