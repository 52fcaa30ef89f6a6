"""Smallest FSDP degree that fits a memory budget: the Scaling Book's closed form.

*A Scaling Book approximation* (Austin et al. 2025, "How to Scale Your Model", ch. 5
worked example), not the full model: per-device memory is the whole training state
(parameters, master weights, gradients and optimizer state, all ZeRO-3 sharded over N
devices) plus the activations of the tokens one device processes, a fraction f of them
sharded too: M(N) = S/N + A·((1-f) + f/N). It is linear in 1/N, so the smallest N with
M(N) <= budget is N >= (S + f·A) / (budget - (1-f)·A). The full model's answer (per-device
peak of the engine, framework temporaries included) is ``costmodel.engine.inverse``.
"""

from __future__ import annotations

import math

import sympy as sp

from costmodel.book.bounds import LABEL
from costmodel.engine.quantities import structure_of
from costmodel.single.memory import activation_memory, state_memory
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.symbols import T, b, values_for

N_fsdp = sp.Symbol("N_FSDP", positive=True)


_EXPR_CACHE: dict[tuple, dict[str, sp.Expr]] = {}


def min_fsdp_expr(model: ModelSpec, train: TrainSpec, fraction: float) -> dict[str, sp.Expr]:
    """Per-device memory as a function of N_FSDP, and the N where it meets a budget.

    The expressions depend only on the specs' structure (sizes are symbols), so they are
    solved once per structure and fraction.
    """
    key = (structure_of(model, train), fraction)
    if key not in _EXPR_CACHE:
        _EXPR_CACHE[key] = _min_fsdp_expr(model, train, fraction)
    return _EXPR_CACHE[key]


def _min_fsdp_expr(model: ModelSpec, train: TrainSpec, fraction: float) -> dict[str, sp.Expr]:
    budget = sp.Symbol("M_budget", positive=True)
    state = sum(state_memory(model, train).values())
    acts = activation_memory(model, train)["total"]
    f = sp.nsimplify(fraction)
    per_device = state / N_fsdp + acts * ((1 - f) + f / N_fsdp)
    # per_device is linear in 1/N: per_device = budget at N = (state + f·acts) / (budget -
    # (1 - f)·acts), in closed form (sympy's solve found the same root ~50x slower)
    return {
        "per_device": per_device,
        "n_at_budget": (state + f * acts) / (budget - (1 - f) * acts),
        "budget": budget,
        "state": state,
        "activations": acts,
    }


def min_fsdp(
    model: ModelSpec, train: TrainSpec, budget_bytes: float, batch_tokens: int, fraction: float
) -> dict:
    """Smallest FSDP degree that fits; ``batch_tokens`` per device (a multiple of seq)."""
    checks.number("budget", budget_bytes)
    if not 0 <= fraction <= 1:
        raise SpecError(
            "sharded_activation_fraction",
            f"sharded-activation-fraction must be in [0, 1] (got {fraction})",
        )
    if batch_tokens < 0 or batch_tokens % train.seq:
        raise SpecError(
            "batch_tokens",
            f"batch-tokens must be a non-negative multiple of seq={train.seq} (got {batch_tokens})",
        )
    exprs = min_fsdp_expr(model, train, fraction)
    values = {**values_for(model, train), b: batch_tokens // train.seq, T: train.seq}
    state = int(exprs["state"].subs(values))
    acts = int(exprs["activations"].subs(values)) if batch_tokens else 0
    floor = (1 - fraction) * acts
    if floor >= budget_bytes:
        raise SpecError(
            "budget",
            f"the unsharded activations alone ({floor:.4g} B) exceed the budget "
            f"({budget_bytes:.4g} B): shard more of them or use fewer tokens",
        )
    n_real = (state + fraction * acts) / (budget_bytes - floor)
    n = max(1, math.ceil(n_real - 1e-12))
    per_device = state / n + acts * ((1 - fraction) + fraction / n)
    return {
        "approximation": LABEL,
        "fsdp": n,
        "fsdp_power_of_two": 1 << (n - 1).bit_length(),
        "fsdp_exact": n_real,
        "state_bytes": state,
        "activation_bytes": acts,
        "per_device_bytes": per_device,
        "budget_bytes": budget_bytes,
        "latex": sp.latex(exprs["n_at_budget"]),
    }
