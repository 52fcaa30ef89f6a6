"""Model and training specifications: frozen, keyword-only, validated dataclasses.

Every field is documented where it is declared. Validation raises ``ValueError`` whose
message names the field and the constraint, so a CLI or app can show it verbatim.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import Any

FFN_KINDS = ("swiglu", "gelu", "relu")
NORM_KINDS = ("rmsnorm", "layernorm")
POS_KINDS = ("rope", "learned")
PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16", "fp8")
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "none")
OPTIMIZER_IMPLS = ("foreach", "fused")
ATTENTION_KERNELS = ("naive", "flash")
RECOMPUTE_POLICIES = ("none", "full", "selective")


def _positive_int(obj: Any, name: str, *, allow_zero: bool = False) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"{name} must be {bound} (got {value})")


def _choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)} (got {value!r})")


def _flag(obj: Any, name: str) -> None:
    if not isinstance(getattr(obj, name), bool):
        raise ValueError(f"{name} must be true or false (got {getattr(obj, name)!r})")


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
    """Per-head width; defaults to ``d_model // n_heads``."""
    d_ff: int
    """FFN hidden width F."""
    ffn: str = "swiglu"
    """``swiglu`` (three matrices, SiLU gate), ``gelu`` or ``relu`` (two matrices)."""
    norm: str = "rmsnorm"
    """``rmsnorm`` (weight only) or ``layernorm`` (weight and bias)."""
    bias: bool = False
    """Biases on every linear layer (GPT-2/GPT-3 style)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections only (Qwen2 style); implied by ``bias``."""
    tied: bool = False
    """LM head shares the token-embedding matrix."""
    pos: str = "rope"
    """``rope`` (no parameters) or ``learned`` (a ``max_positions`` x D table)."""
    max_positions: int = 2048
    """Context length the model supports; sizes the learned position table."""
    ffn_only: bool = False
    """Blocks are the FFN alone: no attention, norms, embedding or LM head (Scaling Book XXL)."""

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_positions"):
            _positive_int(self, name)
        _positive_int(self, "vocab", allow_zero=True)
        for name in ("bias", "qkv_bias", "tied", "ffn_only"):
            _flag(self, name)
        _choice(self, "ffn", FFN_KINDS)
        _choice(self, "norm", NORM_KINDS)
        _choice(self, "pos", POS_KINDS)
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"n_heads must divide d_model when head_dim is not given "
                    f"(got d_model={self.d_model}, n_heads={self.n_heads})"
                )
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        _positive_int(self, "head_dim")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_kv_heads must divide n_heads (got n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads})"
            )
        if self.ffn_only and self.vocab != 0:
            raise ValueError(f"vocab must be 0 for an ffn_only model (got {self.vocab})")
        if not self.ffn_only and self.vocab == 0:
            raise ValueError("vocab must be >= 1 (got 0)")
        if self.pos == "rope" and self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rope (got {self.head_dim})")

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
    precision: str = "bf16-mixed"
    """``fp32`` (IEEE fp32 matmuls, torch's default), ``tf32``, ``bf16-mixed``/``fp16-mixed``
    (fp32 parameters, low-precision compute, as torch.autocast), ``bf16`` (everything bf16),
    ``fp8`` (fp8 matmul operands, bf16 activations, fp32 master; modelled, not validated)."""
    optimizer: str = "adamw"
    """``adamw``/``adam`` (two states), ``sgd-momentum`` (one), ``sgd`` or ``none`` (no state)."""
    optimizer_impl: str = "foreach"
    """``foreach`` (torch's multi-tensor kernels: one pass over memory per elementwise op,
    torch's default on GPU) or ``fused`` (one kernel reads and writes each tensor once)."""
    attention: str = "flash"
    """``naive`` materialises the T x T probabilities; ``flash`` saves only O and logsumexp."""
    recompute: str = "none"
    """``none``; ``full`` checkpoints every block; ``selective`` checkpoints the attention core
    (Korthikanti et al. 2022, Sec. 4.2)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; must divide ``batch``."""

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "grad_accum"):
            _positive_int(self, name)
        _choice(self, "precision", PRECISIONS)
        _choice(self, "optimizer", OPTIMIZERS)
        _choice(self, "optimizer_impl", OPTIMIZER_IMPLS)
        _choice(self, "attention", ATTENTION_KERNELS)
        _choice(self, "recompute", RECOMPUTE_POLICIES)
        if self.batch % self.grad_accum:
            raise ValueError(
                f"grad_accum must divide batch (got batch={self.batch}, "
                f"grad_accum={self.grad_accum})"
            )

    @property
    def micro_batch(self) -> int:
        """Sequences in one forward/backward pass."""
        return self.batch // self.grad_accum

    def replace(self, **changes: Any) -> TrainSpec:
        """A copy with ``changes`` applied and validated again; unknown fields are an error."""
        return _replace(self, changes)


def _replace(spec: Any, changes: dict[str, Any]) -> Any:
    known = {f.name for f in fields(spec)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ValueError(f"unknown {type(spec).__name__} field(s): {', '.join(unknown)}")
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    # Derived defaults follow the fields they derive from unless set explicitly.
    if ("n_heads" in changes or "d_model" in changes) and "head_dim" not in changes:
        values["head_dim"] = None
    if "n_heads" in changes and "n_kv_heads" not in changes and spec.n_kv_heads == spec.n_heads:
        values["n_kv_heads"] = None
    values.update(changes)
    return type(spec)(**values)


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> first sentence of its docstring (for CLI help and the app)."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            text = " ".join(str(nxt.value.value).split())  # type: ignore[attr-defined]
            docs[node.target.id] = text  # type: ignore[attr-defined]
    return docs


__all__ = ["ModelSpec", "TrainSpec", "field_docs"]
