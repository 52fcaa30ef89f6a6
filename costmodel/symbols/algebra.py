"""One formula, two readings: sympy expressions, or numbers computed directly.

Every formula of the model is a plain Python function over the package's symbols
(:class:`Var`). Outside any binding a symbol reads as its sympy symbol, so a formula builds
the expression that ``Estimate.expr`` shows and the docs print. Inside :func:`numeric`,
each symbol reads as its value (a Python number, or a numpy array for a sweep or a layout
search), so the same function computes the number without building, simplifying or
compiling an expression (issue 58: building a structure's expressions and lambdifying them
cost 0.1-0.3 s each, a cold ``plan`` needed 48 of them).

The few operations that are not Python arithmetic dispatch on the reading: :func:`smax`,
:func:`smin`, :func:`sceil`, :func:`sfloor`, :func:`ratio` (an exact fraction where
symbolic, a float where numeric), :func:`sqrt`, :func:`log`. A formula that needs a
quantity with some symbols standing for others (a device's tokens for the batch's, a tp
rank's FFN width for the model's) evaluates it under :func:`bind`, the numeric twin of
sympy's simultaneous ``xreplace``: every read of a bound symbol gives its replacement,
computed before the binding. Structure (kinds, flags, which parallel features are on) is
a Python ``if`` on the specs, never on a symbol's value.

sympy is imported only when a symbol is read symbolically (:attr:`Var.sym`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np


@dataclass(frozen=True)
class _Env:
    values: Mapping[Var, Any] = field(default_factory=dict)
    symbolic: bool = True
    exact: bool = False
    """Numbers without arrays: a division of integers stays an exact Fraction."""
    memo: dict = field(default_factory=dict)
    """Results of :func:`shared` formulas under this reading."""


_ENV: contextvars.ContextVar[_Env | None] = contextvars.ContextVar("costmodel_env", default=None)


class UnboundSymbol(KeyError):
    """A numeric evaluation read a symbol it was given no value for."""

    def __str__(self) -> str:
        return str(self.args[0])


class Values(np.ndarray):
    """A numpy array with the value semantics formulas assume of numbers: ``a += b``
    makes a new array (numpy's would write into ``a``, and through it into every other
    quantity that holds the same array); every array a formula computes from one is one."""

    def __iadd__(self, other: Any) -> Any:
        return self + other

    def __isub__(self, other: Any) -> Any:
        return self - other

    def __imul__(self, other: Any) -> Any:
        return self * other

    def __itruediv__(self, other: Any) -> Any:
        return self / other

    def __ifloordiv__(self, other: Any) -> Any:
        return self // other

    def __imod__(self, other: Any) -> Any:
        return self % other

    def __ipow__(self, other: Any) -> Any:
        return self**other


def _read_only(x: Any) -> Any:
    """An array as :class:`Values` that cannot be written (a symbol's value)."""
    if not isinstance(x, np.ndarray):
        return x
    view = x.view(Values)
    view.flags.writeable = False
    return view


def exact() -> bool:
    """Whether numbers here are exact (no arrays: a division of counts stays a Fraction)."""
    env = _ENV.get()
    return env is not None and env.exact


def symbolic() -> bool:
    """Whether formulas read as sympy expressions here (outside :func:`numeric`)."""
    env = _ENV.get()
    return env is None or env.symbolic


@contextlib.contextmanager
def numeric(values: Mapping[Var, Any]) -> Iterator[None]:
    """Formulas called inside read each symbol as its value in ``values`` (numbers or
    numpy arrays of one shape); a symbol without one raises :class:`UnboundSymbol`."""
    exact = not any(isinstance(x, np.ndarray) for x in values.values())
    if exact:  # integers as fractions: every division of counts stays exact
        values = {k: Fraction(x) if type(x) is int else x for k, x in values.items()}
    else:  # read-only: a formula's in-place ``+=`` must never change a symbol's value
        values = {k: _read_only(x) for k, x in values.items()}
    token = _ENV.set(_Env(dict(values), symbolic=False, exact=exact))
    try:
        yield
    finally:
        _ENV.reset(token)


@contextlib.contextmanager
def bind(values: Mapping[Var, Any]) -> Iterator[None]:
    """Formulas called inside read each symbol in ``values`` as its replacement (computed
    before, in the enclosing reading), the others as before: sympy's simultaneous
    ``xreplace`` of those symbols, applied while the formula is built."""
    env = _ENV.get() or _Env()
    token = _ENV.set(_Env({**env.values, **values}, symbolic=env.symbolic, exact=env.exact))
    try:
        yield
    finally:
        _ENV.reset(token)


def shared(fn: Any) -> Any:
    """A formula computed once per reading and arguments (its arguments hashable: specs,
    flags): inside :func:`numeric` or :func:`bind` every later call reads the first's
    result, as sympy's shared subexpressions do (``param_breakdown`` is asked some 40
    times by one layout's quantities); outside (symbolic, unbound) it is called as is."""

    @functools.wraps(fn)
    def once(*args: Any, **kwargs: Any) -> Any:
        env = _ENV.get()
        if env is None:
            return fn(*args, **kwargs)
        key = (fn, args, tuple(kwargs.items()))
        try:
            out = env.memo[key]
        except KeyError:
            out = env.memo[key] = fn(*args, **kwargs)
        except TypeError:  # an argument that holds an array (a rank at N_pp - 1): no memo
            return fn(*args, **kwargs)
        return type(out)(out) if isinstance(out, dict | list) else out  # a caller may change it

    return once


def resolve(x: Any) -> Any:
    """``x`` as it reads here (a symbol's sympy symbol or value; anything else as is)."""
    return x.value() if type(x) is Var else x


def as_expr(value: Any) -> Any:
    """A number, a symbol or an expression as a sympy expression where symbolic (never
    parses strings); as it reads (a symbol's value) where numeric."""
    if not symbolic():
        return resolve(value)
    sp = _sympy()
    value = resolve(value)
    if isinstance(value, sp.Basic):
        return value
    if isinstance(value, int):
        return sp.Integer(value)
    if isinstance(value, float):
        return sp.Float(value)
    raise TypeError(f"expected a number or a sympy expression, got {type(value).__name__}")


def _sympy() -> Any:
    import sympy

    return sympy


class Var:
    """A symbol of the model (``costmodel.symbols``): its sympy symbol where formulas read
    symbolically, its value inside :func:`numeric` (module doc). Attributes it does not
    have are its sympy symbol's (``T.is_positive``); sympy takes it where it takes a symbol
    (``expr.subs(T, 8192)``, ``sp.diff(expr, T)``)."""

    __slots__ = ("_sym", "assumptions", "name")
    __array_ufunc__ = None  # ``array * var``: numpy defers to Var.__rmul__ (on its value)

    def __init__(self, name: str, **assumptions: bool) -> None:
        self.name = name
        self.assumptions = assumptions
        self._sym = None

    @property
    def sym(self) -> Any:
        """The sympy symbol (built, and sympy imported, on first use)."""
        if self._sym is None:
            self._sym = _sympy().Symbol(self.name, **self.assumptions)
        return self._sym

    def value(self) -> Any:
        """What this symbol reads as here (module doc)."""
        env = _ENV.get()
        if env is None:
            return self.sym
        try:
            return env.values[self]
        except KeyError:
            if env.symbolic:
                return self.sym
            raise UnboundSymbol(f"no value given for the symbol {self.name}") from None

    def _sympy_(self) -> Any:
        return _sympy().sympify(self.value(), strict=True)  # a symbol or a number, never text

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.sym, attr)

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def __neg__(self) -> Any:
        return -self.value()

    def __pos__(self) -> Any:
        return self.value()


def _divide(a: Any, b: Any) -> Any:
    """a / b: exact (a Fraction) where both are integers or fractions and the numbers
    have no arrays (a count stays an integer however its formula divides), else ``/``."""
    if type(a) in _EXACT and type(b) in _EXACT:
        env = _ENV.get()
        if env is not None and env.exact:
            return Fraction(a) / b
    return a / b


_EXACT = frozenset((int, Fraction))


def _operators(op: Any) -> tuple[Any, Any]:
    def forward(self: Var, other: Any) -> Any:
        return op(self.value(), resolve(other))

    def reflected(self: Var, other: Any) -> Any:
        return op(resolve(other), self.value())

    return forward, reflected


for _name, _op in (("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", _divide), ("floordiv", operator.floordiv),
                   ("mod", operator.mod), ("pow", operator.pow)):  # fmt: skip
    _fwd, _rev = _operators(_op)
    setattr(Var, f"__{_name}__", _fwd)
    setattr(Var, f"__r{_name}__", _rev)


def symbols(names: str, **assumptions: bool) -> tuple[Var, ...]:
    """One :class:`Var` per space-separated name, with the same assumptions (as
    ``sympy.symbols``)."""
    return tuple(Var(name, **assumptions) for name in names.split())


class SymbolMap(dict):
    """A dict keyed by sympy symbols that also takes the package's :class:`Var` (``T``) for
    its symbol: what sympy's ``subs``/``xreplace`` and ``free_symbols`` comparisons need,
    indexed as users index it (``values[T]``)."""

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(key.sym if isinstance(key, Var) else key)

    def __contains__(self, key: Any) -> bool:
        return super().__contains__(key.sym if isinstance(key, Var) else key)

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(key.sym if isinstance(key, Var) else key, default)


def by_symbol(values: Any) -> SymbolMap:
    """``values`` keyed by sympy symbols (each :class:`Var` by its ``sym``), as sympy's
    ``xreplace`` matches them; values that are symbols become theirs too."""
    return SymbolMap({as_expr(k) if isinstance(k, Var) else k:
                      as_expr(v) if isinstance(v, Var) else v
                      for k, v in dict(values).items()})  # fmt: skip
