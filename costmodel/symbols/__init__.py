"""Every symbol of the cost model, declared once with its assumptions.

Letters follow the Scaling Book (Austin et al. 2025, "How to Scale Your Model"): B batch,
T sequence length, D model width, F FFN width, L layers, H query heads, K key/value heads,
V vocabulary. ``d_h`` is the head width, ``P`` the learned-position table length and ``b``
the micro-batch (``B`` divided by the gradient-accumulation steps).

Use these symbols, not new ones: ``from costmodel.symbols import T, D`` or
``costmodel.symbol("T")``. Each is a sympy symbol with assumptions (``positive``,
``integer``), and sympy tells symbols apart by name *and* assumptions, so
``sp.Symbol("T")`` is another symbol: ``sp.diff(expr, sp.Symbol("T"))`` is 0 and
``expr.subs(sp.Symbol("T"), 8192)`` changes nothing. :func:`symbol` looks a symbol up by
its printed name.

An estimate's :meth:`~costmodel.engine.estimate.Estimate.symbol_values` maps every symbol
to its number, so ``est.expr("time_s.step").subs(est.symbol_values())`` is the estimate's
step time. ``Estimate.expr`` returns expressions whose ``Max``/``Min`` (:class:`SubsMax`,
:class:`SubsMin`) wait for numbers before they compare: sympy's own, given some symbols
but not others, may drop an argument it cannot order (``Max(1, floor(132/ceiling(a/b)))``
becomes ``floor(...)``, then 0/0 and ``nan is not comparable``).

The formulas themselves read these symbols through :mod:`costmodel.symbols.core` (each a
:class:`~costmodel.symbols.algebra.Var`): as these sympy symbols where they build the
expressions shown, as numbers where they compute an estimate, a sweep or a plan
(:mod:`costmodel.symbols.algebra`), so that numbers never import sympy. This module hands
out the sympy symbols, imported on first use.
"""

from __future__ import annotations

from typing import Any

from costmodel.symbols import core
from costmodel.symbols.algebra import Var

_GROUPS = ("MODEL_SYMBOLS", "TRAIN_SYMBOLS", "ALL_SYMBOLS", "PARALLEL_SYMBOLS",
           "HARDWARE_SYMBOLS", "BUDGET_SYMBOLS")  # fmt: skip
_FORMS = ("SubsMax", "SubsMin", "subs_safe")


def symbol(name: str) -> Any:
    """The package's sympy symbol printed as ``name`` (with its assumptions; module doc)."""
    return core.symbol(name).sym


def values_for(model: Any, train: Any = None) -> dict[Any, Any]:
    """Symbol -> integer value for a ModelSpec (and optionally a TrainSpec), keyed by the
    sympy symbols (``expr.xreplace(values_for(model))``; ``core.values_for``'s)."""
    from costmodel.symbols.algebra import by_symbol

    return by_symbol(core.values_for(model, train))


def __getattr__(name: str) -> Any:
    """A symbol (``T``) as its sympy symbol; the groups (``ALL_SYMBOLS``), ``SYMBOLS`` (by
    printed name) and ``DESCRIPTIONS`` over sympy symbols; the sympy helpers
    (:mod:`costmodel.symbols.forms`); the rest of :mod:`costmodel.symbols.core` as is."""
    if name in _FORMS:
        from costmodel.symbols import forms

        return getattr(forms, name)
    if name in _GROUPS:
        return tuple(v.sym for v in getattr(core, name))
    if name == "SYMBOLS":
        return {k: v.sym for k, v in core.SYMBOLS.items()}
    if name == "DESCRIPTIONS":
        return {k.sym: text for k, text in core.DESCRIPTIONS.items()}
    try:
        found = getattr(core, name)
    except AttributeError:
        raise AttributeError(f"module 'costmodel.symbols' has no attribute {name!r}") from None
    return found.sym if isinstance(found, Var) else found
