"""Rules between a spec's sizes and between specs, as functions of plain values: the same
function checks a scalar spec (``ModelSpec.__post_init__``) and numpy grids of them
(``costmodel.config.check``, which runs them for every entry point). Each raises
:class:`~costmodel.specs.checks.SpecError` naming the field and the constraint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.specs import checks
from costmodel.specs.checks import SpecError


def derived_head_dim(d_model: Any, n_heads: Any) -> Any:
    """d_model / n_heads, which must divide (scalars or arrays)."""
    checks.divides("n_heads", n_heads, "d_model", d_model, field="n_heads")
    return d_model // n_heads


def model_rules(*, n_heads: Any, n_kv_heads: Any, head_dim: Any, pos: str) -> None:
    """Rules between ModelSpec sizes (scalars or arrays of them)."""
    checks.divides("n_kv_heads", n_kv_heads, "n_heads", n_heads)
    if pos == "rope" and not np.all(np.asarray(head_dim) % 2 == 0):
        raise SpecError("head_dim", f"head_dim must be even for rope (got {head_dim})")


def moe_rules(model: Any) -> None:
    """An MoE model's sizes (scalars or arrays; a dense point, n_experts 0, passes): top-k
    within the experts, fewer dense leading blocks than blocks."""
    moe = np.asarray(model.n_experts) > 0
    k, e = np.asarray(model.experts_per_token), np.asarray(model.n_experts)
    ok = ~moe | ((k >= 1) & (k <= e))

    def top_k() -> str:
        got, experts = checks._first_bad(ok, k, e)
        return f"experts_per_token must be in 1..n_experts = {experts} (got {got})"

    checks.require(ok, "experts_per_token", top_k)
    dense, layers = np.asarray(model.dense_layers), np.asarray(model.n_layers)
    ok = ~moe | (dense < layers)

    def leading() -> str:
        got, n = checks._first_bad(ok, dense, layers)
        return f"dense_layers must be below n_layers = {n} (got {got})"

    checks.require(ok, "dense_layers", leading)


def moe_train_rule(model: Any, recompute: Any, elementwise: Any = "fused") -> None:
    """Op-level selective recomputation saves every second matmul of a block in order; an
    MoE block's matmuls run per expert, in an order routing decides, and MLA's latents add
    matmuls the policy's count has not been checked on: not modelled. MLA's eager
    elementwise ops (latent norms, splits, concatenations, padding) are not counted, nor
    a parallel block's (one norm, two branches summed), whose op order op-level AC follows."""
    moe = np.asarray(getattr(model, "n_experts", 0)) > 0
    ok = ~moe | (np.asarray(recompute) != "selective-op")
    checks.require(ok, "recompute", lambda: "recompute=selective-op is not modelled for a "
                   "mixture-of-experts model (use 'none', 'selective' or 'full')")  # fmt: skip
    mla = np.asarray(getattr(model, "kv_lora_rank", 0)) > 0
    ok = ~mla | (np.asarray(recompute) != "selective-op")
    checks.require(ok, "recompute", lambda: "recompute=selective-op is not modelled for "
                   "MLA (kv_lora_rank > 0; use 'none', 'selective' or 'full')")  # fmt: skip
    ok = ~mla | (np.asarray(elementwise) != "eager")
    checks.require(ok, "elementwise", lambda: "elementwise=eager is not modelled for MLA "
                   "(kv_lora_rank > 0): its op-by-op traffic is not counted")  # fmt: skip
    parallel = np.asarray(getattr(model, "parallel_block", False), dtype=bool)
    for name, value, bad in (("recompute", recompute, "selective-op"),
                             ("elementwise", elementwise, "eager")):  # fmt: skip
        ok = ~parallel | (np.asarray(value) != bad)
        checks.require(ok, name, lambda n=name, b=bad: f"{n}={b} is not modelled for a "
                       "parallel block (parallel_block): its op order and op-by-op traffic "
                       "are not counted")  # fmt: skip


def check_positions(pos: str, seq: Any, max_positions: Any) -> None:
    """A learned position table has ``max_positions`` rows: longer sequences cannot run."""
    if pos == "learned":
        checks.at_most("seq", seq, "max_positions", max_positions, "for learned positions")


def recompute_rule(model: Any, train: Any) -> None:
    """Checkpointing every n-th block (``TrainSpec.recompute_every`` > 1) is a kind of full
    recomputation, costed for blocks of a model with attention and for full training (an
    FFN-only stack's first block keeps the model's input, adapters are not counted per
    block)."""
    every = np.asarray(getattr(train, "recompute_every", 1))
    if np.all(every == 1):
        return
    partial = every > 1
    ok = ~partial | (np.asarray(train.recompute) == "full")
    checks.require(ok, "recompute_every", lambda: "recompute_every > 1 checkpoints every n-th "
                   "block: it needs recompute=full")  # fmt: skip
    for name, bad in (("ffn_only", bool(model.ffn_only)), ("finetune", train.finetune != "full")):
        checks.require(~partial | (not bad), "recompute_every", lambda n=name: "recompute_every "
                       f"> 1 is not modelled with {n} (use recompute_every 1)")  # fmt: skip
    checks.at_most("recompute_every", every, "n_layers", model.n_layers, "(every n-th of the "
                   "model's blocks; past n_layers only the first would be)")  # fmt: skip


MAX_BATCH = 2**24
"""The most sequences a step may hold: 16,777,216, thousands of times any published run's
(Llama 3 405B's 16M-token batches were 2,048 sequences of 8,192; Dubey et al. 2024, Sec.
3.4.1). Past it an input is a typo (``plan --global-batch 99999999999`` ranked layouts of
216-year steps)."""


def train_rules(*, batch: Any, grad_accum: Any) -> None:
    """Rules between TrainSpec sizes (scalars or arrays of them): the batch at most
    :data:`MAX_BATCH`, a whole number of micro-batches."""
    checks.at_most("batch", batch, f"{MAX_BATCH:,}", MAX_BATCH, "sequences a step (thousands "
                   "of times any published run's)")  # fmt: skip
    checks.divides("grad_accum", grad_accum, "batch", batch)
