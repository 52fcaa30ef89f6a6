"""A serving step's counts as numbers: the formulas of :mod:`costmodel.serving.terms`
with a model's sizes and a step's load (sequences, cached tokens, tokens through the
blocks) substituted, in exact rational arithmetic where the formula gives an integer
(the same number ``xreplace`` gives), each expression compiled once per model's sizes."""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from costmodel.serving import terms
from costmodel.specs.model import ModelSpec
from costmodel.symbols.algebra import by_symbol
from costmodel.symbols.core import B, T, as_expr, symbols

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


_TOKENS, _HEAD = symbols("tokens head_tokens", positive=True)
_LOAD = frozenset({B, T, _TOKENS, _HEAD})
"""The symbols of a step's load (sequences, cached tokens): a rollout or a sweep prices one
model at many of them, so the model's sizes are substituted once before them."""


def num(expr: Any, values: dict) -> Any:
    """An exact integer where the expression gives one, else a float."""
    sizes = frozenset((k, v) for k, v in values.items() if k not in _LOAD)
    load = frozenset((k, v) for k, v in values.items() if k in _LOAD)
    return _evaluated(as_expr(expr), sizes, load)


@functools.lru_cache(maxsize=65536)
def _evaluated(expr: sp.Expr, sizes: frozenset, load: frozenset) -> Any:
    """:func:`num`, once per expression and values (a sweep or a fit asks the same counts
    of a model again and again; only the hardware's rates change)."""
    given = {k.name: Fraction(v) for k, v in load}  # a symbol not given fails if used
    out = _at_sizes(expr, sizes)(**{s.name: given.get(s.name) for s in _LOAD})
    if isinstance(out, Fraction | int):
        return int(out) if Fraction(out).denominator == 1 else float(out)
    return float(out)


def linear_flops(model: ModelSpec, tokens: int, head_tokens: int, vals: dict) -> Any:
    """:func:`terms.linear_flops` of ``tokens`` through the blocks and ``head_tokens``
    through the head: one expression per model, the counts given as values."""
    expr = terms.linear_flops(model, _TOKENS, _HEAD)
    return num(expr, {**vals, _TOKENS: tokens, _HEAD: head_tokens})


def expert_flops(model: ModelSpec, tokens: float, vals: dict) -> Any:
    """:func:`terms.expert_flops` of ``tokens``: the routed experts' part of
    :func:`linear_flops`."""
    return num(terms.expert_flops(model, _TOKENS), {**vals, _TOKENS: tokens})


@functools.cache
def _exact_printer() -> type:
    """sympy's Python printer whose rationals stay exact (``fractions.Fraction``)."""
    from sympy.printing.pycode import PythonCodePrinter

    class ExactPrinter(PythonCodePrinter):
        def _print_Rational(self, expr: Any) -> str:
            return f"Fraction({expr.p}, {expr.q})"

    return ExactPrinter


_EXACT = {"Fraction": Fraction, "math": math, "Min": min, "Max": max}


@functools.lru_cache(maxsize=16384)
def _at_sizes(expr: sp.Expr, sizes: frozenset) -> Any:
    """``expr`` with a model's sizes in, as a function of its load symbols (keywords), in
    exact rational arithmetic: the same number ``xreplace`` gives, without building an
    expression per load."""
    import sympy as sp

    args = [as_expr(s) for s in sorted(_LOAD, key=lambda s: s.name)]
    return sp.lambdify(args, expr.xreplace(by_symbol(sizes)), modules=[_EXACT, "math"],
                       printer=_exact_printer())  # fmt: skip


__all__ = ["expert_flops", "linear_flops", "num"]
