"""The operations of the formulas that are not Python arithmetic, each dispatching on how
the formulas read here (:mod:`costmodel.symbols.algebra`): unevaluated sympy where they
build expressions, Python's ``math`` on numbers, numpy on arrays. ``smax``/``smin``
(``Max``/``Min``), ``sceil``/``sfloor``, ``smod``, ``ratio`` (an exact ``Rational``, a
``Fraction``, or a float), ``sqrt``, ``log``, ``add`` (one ``Add``), ``expand``,
``scaled`` (c·x without a pass for c = 1), ``integer`` (a sympy ``Integer`` where
symbolic: exact divisions), ``is_zero`` (a part that
can be left out) and ``unevaluated`` (sympy's ``evaluate(False)``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
from fractions import Fraction
from typing import Any

import numpy as np

from costmodel.symbols.algebra import _sympy, exact, resolve, symbolic


def _expressions(args: tuple[Any, ...]) -> bool:
    """Whether any of ``args`` is a sympy expression (only where formulas read
    symbolically; plain numbers there are taken as numbers)."""
    return symbolic() and any(isinstance(a, _sympy().Basic) for a in args)


def _arrays(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, np.ndarray) for a in args)


def _lattice(cls: Any, args: tuple[Any, ...]) -> Any:
    """``cls(*args, evaluate=False)`` (Max or Min) with the arguments in the caller's order,
    repeats dropped: sympy sorts them canonically, by node counts over whole subtrees,
    which was a sixth of a plan's cold build (2.3 s over 5,744 maxima)."""
    sp = _sympy()
    unique = tuple(dict.fromkeys(sp.sympify(a, strict=True) for a in args))
    if len(unique) == 1:
        return unique[0]
    obj = sp.Expr.__new__(cls, *unique)
    obj._argset = frozenset(unique)
    return obj


def smax(*args: Any) -> Any:
    """max(...): unevaluated ``Max`` where symbolic (sympy's Max compares its arguments
    symbolically to simplify, which made building a structure's expressions ~8x slower),
    the builtin max of numbers, ``numpy.maximum`` of arrays."""
    args = tuple(map(resolve, args))
    if _expressions(args):
        return _lattice(_sympy().Max, args)
    return functools.reduce(np.maximum, args) if _arrays(args) else max(args)


def smin(*args: Any) -> Any:
    """min(...), as :func:`smax`."""
    args = tuple(map(resolve, args))
    if _expressions(args):
        return _lattice(_sympy().Min, args)
    return functools.reduce(np.minimum, args) if _arrays(args) else min(args)


def sceil(x: Any) -> Any:
    """ceiling(x): unevaluated where symbolic (sympy's asks its argument's sign and
    integrality through the assumptions system, a fifth of a plan's cold build),
    ``math.ceil`` of a number, ``numpy.ceil`` of an array."""
    x = resolve(x)
    if _expressions((x,)):
        return _sympy().ceiling(x, evaluate=False)
    return np.ceil(x) if isinstance(x, np.ndarray) else math.ceil(x)


def sfloor(x: Any) -> Any:
    """floor(x), as :func:`sceil`."""
    x = resolve(x)
    if _expressions((x,)):
        return _sympy().floor(x, evaluate=False)
    return np.floor(x) if isinstance(x, np.ndarray) else math.floor(x)


def ratio(p: int, q: int) -> Any:
    """p/q of two integers: an exact sympy Rational where symbolic, a Fraction where
    numbers are exact (no arrays), a float otherwise."""
    if symbolic():
        return _sympy().Rational(p, q)
    return Fraction(p, q) if exact() else p / q


def sqrt(x: Any) -> Any:
    """The square root: sympy's, numpy's of an array, math's of a number."""
    x = resolve(x)
    if symbolic():
        return _sympy().sqrt(x)
    return np.sqrt(x) if isinstance(x, np.ndarray) else math.sqrt(x)


def log(x: Any) -> Any:
    """The natural logarithm, as :func:`sqrt`."""
    x = resolve(x)
    if symbolic():
        return _sympy().log(x)
    return np.log(x) if isinstance(x, np.ndarray) else math.log(x)


def at_least_one(n: Any) -> Any:
    """1 when the non-negative integer ``n`` (a count that may be 0, as shared experts) is
    at least 1, else 0: min(n, 1)."""
    return smin(n, 1)


def more_than_one(n: Any) -> Any:
    """1 when the positive integer ``n`` (a degree, a micro-batch count) exceeds 1, else 0:
    min(n - 1, 1)."""
    return smin(n - 1, 1)


def add(*terms: Any) -> Any:
    """The sum of ``terms`` (0 for none): one ``Add`` where symbolic (sympy flattens it
    once, where ``+`` one term at a time re-flattens), Python's ``+`` where numeric (from
    the first term: ``0 + array`` would be one more pass over a sweep's arrays)."""
    if symbolic():
        return _sympy().Add(*map(resolve, terms))
    return functools.reduce(operator.add, terms) if terms else 0


def scaled(c: Any, x: Any) -> Any:
    """c·x, and ``x`` itself where ``c`` is the number 1 (a count, a share or rows per
    token that is one: where numeric, ``1 * array`` is one more pass over a sweep's
    arrays; where symbolic, sympy drops the 1 itself)."""
    return x if not isinstance(c, np.ndarray) and c == 1 else c * x


def expand(x: Any) -> Any:
    """sympy's ``expand`` where symbolic (products multiplied out, for integer
    coefficients in the formulas shown); the number itself where numeric."""
    return _sympy().expand(resolve(x)) if symbolic() else x


def smod(x: Any, n: Any) -> Any:
    """x mod n: unevaluated ``Mod`` where symbolic, ``%`` of numbers or arrays."""
    x, n = resolve(x), resolve(n)
    return _sympy().Mod(x, n, evaluate=False) if symbolic() else x % n


def unevaluated() -> contextlib.AbstractContextManager[Any]:
    """sympy's ``evaluate(False)`` where symbolic (terms built as written, not
    re-simplified); nothing where numeric."""
    return _sympy().evaluate(False) if symbolic() else contextlib.nullcontext()


def integer(n: int) -> Any:
    """The integer ``n`` as the formulas need it: a sympy Integer where symbolic (so that
    ``0 / shards`` stays an exact 0, not the float Python's division gives), ``n`` itself
    where numeric."""
    return _sympy().Integer(n) if symbolic() else n


def is_zero(x: Any) -> bool:
    """Whether a part of a formula is zero, so that it can be left out: sympy's structural
    test where symbolic (``0``, not an expression that may evaluate to 0); where numeric,
    every value 0 (the parts it is asked of are products of positive sizes, zero only
    where their formula is)."""
    x = resolve(x)
    if symbolic():
        return x == 0
    return bool(np.all(x == 0)) if isinstance(x, np.ndarray) else x == 0
