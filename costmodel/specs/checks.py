"""The one check layer: every rule on user inputs, written once, raising ``SpecError``.

Rules take plain values, so the same function checks a scalar spec field
(``ModelSpec.__post_init__``) and a numpy grid of them (``costmodel.sweep``): the
arithmetic (``%``, ``<=``) is numpy's elementwise arithmetic on arrays, and a rule fails
when any element does, quoting the first that does. Inside ``collect_masks()`` the
grid rules record which elements pass instead of raising, so the planner filters
candidate layouts by the very rules that reject a bad input.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

import numpy as np

MAX_INT = 2**53
"""Sizes above this lose integer precision in float64 evaluation (numpy sweeps)."""


class SpecError(ValueError):
    """A bad input: ``field`` names it (for the app's section routing), ``str()`` is the
    whole sentence, naming the field and the constraint."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    @property
    def message(self) -> str:
        return str(self.args[0])


class UnknownKey(KeyError):
    """A name that is none of the known ones (a quantity, a symbol, a column): a KeyError,
    as a dict's lookup raises, whose ``str()`` is the sentence itself (a KeyError's own is
    the repr of its argument, quotes and all)."""

    def __init__(self, key: Any, message: str) -> None:
        super().__init__(message)
        self.key = key

    def __str__(self) -> str:
        return str(self.args[0])


class Quantities(dict):
    """A result's quantities by key (an estimate's, a serve answer's): a dict that is also
    called as a Mapping's ``values()`` is, so that ``est.values["mfu"]`` and
    ``est.values()`` both work."""

    def __call__(self) -> Any:
        return dict.values(self)


def unknown(kind: str, key: Any, known: Iterable[str], hint: str) -> str:
    """The one sentence for a ``kind`` named ``key`` that is not among ``known``: the closest
    known names (``difflib``; else those that contain ``key``), else ``hint``."""
    names = [str(k) for k in known]
    close = (
        difflib.get_close_matches(str(key), names, n=3)
        or [k for k in names if str(key) and str(key) in k][:3]
    )
    if not close:
        return f"unknown {kind} {key!r}; {hint}"
    shown = [repr(k) for k in close]
    alternatives = " or ".join([", ".join(shown[:-1]), shown[-1]] if len(shown) > 1 else shown)
    return f"unknown {kind} {key!r}; did you mean {alternatives}?"


class Mask(NamedTuple):
    """One grid rule's verdict: the field it names, which points pass, and its sentence
    (quoting the first point that fails)."""

    field: str
    ok: np.ndarray
    message: Callable[[], str]


_MASKS: ContextVar[list[Mask] | None] = ContextVar("masks", default=None)


@contextmanager
def collect_masks() -> Iterator[list[Mask]]:
    """Within this block, grid rules append their verdicts to the yielded list instead of
    raising (:func:`passing`: the points that pass all; :func:`refusal`: the first rule
    a point breaks)."""
    found: list[Mask] = []
    token = _MASKS.set(found)
    try:
        yield found
    finally:
        _MASKS.reset(token)


def require(ok: Any, field: str, message: Callable[[], str]) -> None:
    """A grid rule: ``ok`` elementwise, else ``SpecError(field, message())`` (or, inside
    ``collect_masks()``, ``ok`` recorded)."""
    masks = _MASKS.get()
    if masks is not None:
        masks.append(Mask(field, np.asarray(ok, dtype=bool), message))
    elif not np.all(ok):
        raise SpecError(field, message())


def passing(masks: list[Mask], shape: int | tuple[int, ...]) -> np.ndarray:
    """Which points of a grid of ``shape`` (``n`` points, or a broadcast grid) pass every
    collected rule."""
    return conjunction([m.ok for m in masks], shape)


def conjunction(parts: list[Any], shape: int | tuple[int, ...]) -> np.ndarray:
    """The elementwise and of bool arrays that broadcast to ``shape``, at the smallest
    sizes it can be: each is and-ed into the smallest other that spans its axes, the rest
    smallest first, so the full grid is written once, not once per array (a planner's grid
    of millions of candidates and ~50 rules, most of them on a few axes)."""
    shape = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    groups: dict[tuple[int, ...], np.ndarray] = {}
    for part in parts:
        part = np.asarray(part, dtype=bool)
        part = part.reshape((1,) * (len(shape) - part.ndim) + part.shape)
        groups[part.shape] = groups[part.shape] & part if part.shape in groups else part
    keys = sorted(groups, key=math.prod)
    acc = np.ones((1,) * len(shape), bool)
    for i, key in enumerate(keys):
        wider = next((k for k in keys[i + 1 :] if all(a in (1, b) for a, b in
                                                     zip(key, k, strict=True))), None)  # fmt: skip
        if wider is None:
            acc = acc & groups[key]
        else:
            groups[wider] = groups[wider] & groups[key]
    return np.array(np.broadcast_to(acc, shape))


def refusal(masks: list[Mask], i: int) -> SpecError | None:
    """The error point ``i`` gets from the first collected rule it breaks (None: none),
    the same field and sentence as checking that point alone (its sentence quotes it)."""
    for mask in masks:
        ok = np.broadcast_to(mask.ok, np.broadcast_shapes(mask.ok.shape, (i + 1,)))
        if not ok[i]:
            return SpecError(mask.field, mask.message())
    return None


def _first_bad(ok: Any, *values: Any) -> tuple[Any, ...]:
    """The values at the first failing element (scalars are returned as they are)."""
    if np.ndim(ok) == 0:  # numpy scalars and 0-d arrays as the plain values they hold
        return tuple(v.item() if isinstance(v, np.generic | np.ndarray) else v for v in values)
    index = np.unravel_index(int(np.argmin(np.asarray(ok))), np.shape(ok))
    picked = (np.broadcast_to(v, np.shape(ok))[index] for v in values)
    return tuple(p.item() if isinstance(p, np.generic | np.ndarray) else p for p in picked)


def first(ok: Any, value: Any) -> Any:
    """``value`` at the first failing element of ``ok`` (a scalar as it is)."""
    return _first_bad(ok, value)[0]


def pair(ok: Any, a: Any, b: Any, a_name: str, b_name: str) -> str:
    """``a_name=A, b_name=B`` at the first failing element, for a message."""
    got_a, got_b = _first_bad(ok, a, b)
    return f"{a_name}={got_a}, {b_name}={got_b}"


def integer(field: str, value: Any, *, minimum: int = 1) -> None:
    """An integer (or integer array) >= ``minimum`` and <= 2^53; bools are not integers."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise SpecError(field, f"{field} must hold integers (got dtype {value.dtype})")
        if value.size and (value.min() < minimum or value.max() > MAX_INT):
            bad = value.min() if value.min() < minimum else value.max()
            raise SpecError(field, f"{field} must be in [{minimum}, 2^53] everywhere (got {bad})")
        return
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SpecError(field, f"{field} must be an integer (got {value!r})")
    if value < minimum:
        raise SpecError(field, f"{field} must be >= {minimum} (got {value})")
    if value > MAX_INT:
        bits = int(value).bit_length()  # str() of a huge int can itself raise
        raise SpecError(field, f"{field} must be <= 2^53 (got an integer of {bits} bits)")


def number(field: str, value: Any, *, positive: bool = True, allow_zero: bool = False) -> None:
    """A finite real number, > 0 (or >= 0 with ``allow_zero``) when ``positive``."""
    if isinstance(value, bool | np.bool_) or not isinstance(
        value, int | float | np.integer | np.floating
    ):  # numpy's scalars too (a probe: np.float32 read "must be a number")
        raise SpecError(field, f"{field} must be a number (got {value!r})")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer past any float (a JSON literal of 400 digits)
        finite = False
    if not finite:
        shown = value if isinstance(value, float) else f"an integer of {len(str(value))} digits"
        raise SpecError(field, f"{field} must be finite (got {shown})")
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        raise SpecError(field, f"{field} must be {'>= 0' if allow_zero else '> 0'} (got {value})")


def flag(field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise SpecError(field, f"{field} must be true or false (got {value!r})")


def choice(field: str, value: Any, choices: Iterable[Any]) -> None:
    options = tuple(choices)
    if isinstance(value, bool) or value not in options:
        shown = ", ".join(map(str, options))
        raise SpecError(field, f"{field} must be one of {shown} (got {value!r})")


def divides(by_name: str, by: Any, name: str, value: Any, *, field: str | None = None) -> None:
    """``by`` divides ``value`` (elementwise); the error names both sides."""
    ok = np.asarray(value) % np.asarray(by) == 0

    def message() -> str:
        got_v, got_by = _first_bad(ok, value, by)
        return f"{by_name} must divide {name} (got {name}={got_v}, {by_name}={got_by})"

    require(ok, field or by_name, message)


def at_most(
    name: str, value: Any, limit_name: str, limit: Any, why: str = "", *, field: str = ""
) -> None:
    """``value <= limit`` (elementwise); ``field`` names the input (default ``name``)."""
    ok = np.asarray(value) <= np.asarray(limit)

    def message() -> str:
        got_v, got_l = _first_bad(ok, value, limit)
        reason = f" {why}" if why else ""
        literal = limit_name.replace(",", "") == str(got_l)  # the limit is its own name
        got = f"{name}={got_v}" + ("" if literal else f", {limit_name}={got_l}")
        return f"{name} must be <= {limit_name}{reason} (got {got})"

    require(ok, field or name, message)


__all__ = [
    "MAX_INT",
    "Mask",
    "SpecError",
    "UnknownKey",
    "at_most",
    "choice",
    "collect_masks",
    "conjunction",
    "divides",
    "flag",
    "integer",
    "number",
    "passing",
    "refusal",
    "require",
    "unknown",
]
