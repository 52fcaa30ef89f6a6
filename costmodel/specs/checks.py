"""The one check layer: every rule on user inputs, written once, raising ``SpecError``.

Rules take plain values, so the same function checks a scalar spec field
(``ModelSpec.__post_init__``) and a numpy grid of them (``costmodel.sweep``): the
arithmetic (``%``, ``<=``) is numpy's elementwise arithmetic on arrays, and a rule fails
when any element does, quoting the first that does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

MAX_INT = 2**53
"""Sizes above this lose integer precision in float64 evaluation (numpy, lambdify)."""


class SpecError(ValueError):
    """A bad input: ``field`` names it (for the app's section routing), ``str()`` is the
    whole sentence, naming the field and the constraint."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    @property
    def message(self) -> str:
        return str(self.args[0])


def _first_bad(ok: Any, *values: Any) -> tuple[Any, ...]:
    """The values at the first failing element (scalars are returned as they are)."""
    if np.ndim(ok) == 0:
        return values
    index = np.unravel_index(int(np.argmin(np.asarray(ok))), np.shape(ok))
    return tuple(np.broadcast_to(v, np.shape(ok))[index].item() for v in values)


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
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"{field} must be a number (got {value!r})")
    if not math.isfinite(value):
        raise SpecError(field, f"{field} must be finite (got {value})")
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
    if not np.all(ok):
        got_v, got_by = _first_bad(ok, value, by)
        raise SpecError(
            field or by_name,
            f"{by_name} must divide {name} (got {name}={got_v}, {by_name}={got_by})",
        )


def at_most(
    name: str, value: Any, limit_name: str, limit: Any, why: str = "", *, field: str = ""
) -> None:
    """``value <= limit`` (elementwise); ``field`` names the input (default ``name``)."""
    ok = np.asarray(value) <= np.asarray(limit)
    if not np.all(ok):
        got_v, got_l = _first_bad(ok, value, limit)
        reason = f" {why}" if why else ""
        raise SpecError(
            field or name, f"{name} must be <= {limit_name}{reason} (got {name}={got_v}, "
            f"{limit_name}={got_l})"
        )  # fmt: skip


__all__ = ["MAX_INT", "SpecError", "at_most", "choice", "divides", "flag", "integer", "number"]
