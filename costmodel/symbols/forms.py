"""The sympy side of the symbols: expressions from numbers, and ``Max``/``Min`` that wait
for numbers before they compare (imported only where an expression is built or shown)."""

from __future__ import annotations

from typing import Any

import sympy as sp

from costmodel.symbols.algebra import as_expr


class SubsMax(sp.Max):
    """``Max`` that compares its arguments only once all are numbers (module doc): an
    expression's value is the same, substituted in any order; prints as ``Max``."""

    def __new__(cls, *args: Any, **options: Any) -> sp.Expr:
        args = tuple(as_expr(a) for a in args)
        if all(a.is_number for a in args):
            return sp.Max(*args)
        return sp.Max.__new__(cls, *args, evaluate=False)


class SubsMin(sp.Min):
    """``Min`` that compares its arguments only once all are numbers (see :class:`SubsMax`)."""

    def __new__(cls, *args: Any, **options: Any) -> sp.Expr:
        args = tuple(as_expr(a) for a in args)
        if all(a.is_number for a in args):
            return sp.Min(*args)
        return sp.Min.__new__(cls, *args, evaluate=False)


SubsMax.__name__ = SubsMax.__qualname__ = "Max"  # printed (str, LaTeX, code) as sympy's
SubsMin.__name__ = SubsMin.__qualname__ = "Min"
_SAFE = {sp.Max: SubsMax, sp.Min: SubsMin}


def subs_safe(expr: sp.Expr) -> sp.Expr:
    """``expr`` with every ``Max``/``Min`` as :class:`SubsMax`/:class:`SubsMin` (equal
    value; ``.subs`` in any order gives it)."""
    if not expr.has(sp.Max, sp.Min):
        return expr
    done: dict[sp.Basic, sp.Basic] = {}

    def rebuild(e: sp.Basic) -> sp.Basic:
        # bottom up, each shared subtree once; a Max/Min is built as its safe kind directly:
        # ``expr.replace`` rebuilt each as a Max first, whose argument comparisons
        # (``_find_localzeros``) took 10-25 s on a step-time formula
        if not e.args:
            return e
        if e in done:
            return done[e]
        args = tuple(rebuild(a) for a in e.args)
        safe = _SAFE.get(type(e))
        done[e] = out = safe(*args) if safe else e if args == e.args else e.func(*args)
        return out

    return rebuild(expr)
