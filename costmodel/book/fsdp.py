"""Smallest FSDP degree that fits a memory budget: the Scaling Book's closed form.

*A Scaling Book approximation* (Austin et al. 2025, "How to Scale Your Model", ch. 5
worked example), not the full model: per-device memory is the whole training state
(parameters, master weights, gradients and optimizer state, all ZeRO-3 sharded over N
devices) plus the activations of the tokens one device processes, a fraction f of them
sharded too: M(N) = S/N + A·((1-f) + f/N). It is linear in 1/N, so the smallest N with
M(N) <= budget is N >= (S + f·A) / (budget - (1-f)·A). S is the state the named framework
keeps (``Framework.state`` of one device): under torch.autocast (``reference``) a bf16
copy of the weights beside fp32 master, gradients and Adam (18 B/param for bf16-mixed,
Rajbhandari et al. 2020, Sec. 3.1's 16 plus the cast); FSDP2 casts at the all-gather and
keeps no copy (16 B/param; its gathered units in flight are not state). The full model's
answer (per-device peak of the engine, framework temporaries included) is
``costmodel.engine.inverse``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from costmodel.book.bounds import LABEL
from costmodel.engine.estimate import symbol_values
from costmodel.frameworks.registry import framework_of
from costmodel.single.memory import activation_memory
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import T, as_expr, b, numeric
from costmodel.symbols.ops import add

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def _state(model: ModelSpec, train: TrainSpec, framework: str) -> sp.Expr:
    """The training state one unsharded device keeps under ``framework``: every part of
    ``Framework.state`` but weights gathered only while in flight."""
    par = ParallelSpec(framework=framework)
    kept = framework_of(par)
    parts = kept.state(model, train, par, None)
    persist = kept.params_persist is not False
    return add(*(e for k, e in parts.items() if k != "params" or persist))


def min_fsdp_expr(
    model: ModelSpec, train: TrainSpec, fraction: float, framework: str = "reference"
) -> dict[str, sp.Expr]:
    """The closed form as sympy expressions (a notebook shows them; :func:`min_fsdp`
    computes the same on numbers): per-device memory as a function of N_FSDP, and the N
    where it meets a budget ``M_budget``."""
    import sympy as sp

    n_fsdp, budget = sp.Symbol("N_FSDP", positive=True), sp.Symbol("M_budget", positive=True)
    state = as_expr(_state(model, train, framework))
    acts = as_expr(activation_memory(model, train)["total"])
    f = sp.nsimplify(fraction)
    return {
        "per_device": state / n_fsdp + acts * ((1 - f) + f / n_fsdp),
        "n_at_budget": (state + f * acts) / (budget - (1 - f) * acts),
        "budget": budget,
        "state": state,
        "activations": acts,
    }


def min_fsdp(
    model: ModelSpec,
    train: TrainSpec,
    budget_bytes: float,
    batch_tokens: int,
    fraction: float,
    framework: str = "reference",
) -> dict:
    """Smallest FSDP degree that fits; ``batch_tokens`` per device (a multiple of seq);
    the state as ``framework`` keeps it."""
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
    values = {**symbol_values(model, train), b: batch_tokens // train.seq, T: train.seq}
    with numeric(values):  # per-device memory is state / N + acts ((1 - f) + f / N)
        state = int(_state(model, train, framework))
        acts = int(activation_memory(model, train)["total"]) if batch_tokens else 0
    floor = (1 - fraction) * acts
    if floor >= budget_bytes:
        raise SpecError(
            "budget",
            f"the unsharded activations alone ({floor / 2**30:,.2f} GiB) exceed the budget "
            f"({budget_bytes / 2**30:,.2f} GiB): shard more of them (a larger "
            "sharded-activation-fraction), use fewer tokens, or recompute",
        )
    n_real = (state + fraction * acts) / (budget_bytes - floor)
    n = max(1, math.ceil(n_real - 1e-12))
    per_device = state / n + acts * ((1 - fraction) + fraction / n)
    return {
        "approximation": LABEL,
        "framework": framework,
        "fsdp": n,
        "fsdp_power_of_two": 1 << (n - 1).bit_length(),
        "fsdp_exact": n_real,
        "state_bytes": state,
        "activation_bytes": acts,
        "per_device_bytes": per_device,
        "budget_bytes": budget_bytes,
        "sharded_activation_fraction": fraction,
    }
