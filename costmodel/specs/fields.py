"""What the spec dataclasses say about their own fields: the choices of a ``Literal``
field, the checks every spec runs on its integers, flags and choices, and the attribute
docstrings (for the CLI's help, the app's labels and ``help(cls)``)."""

from __future__ import annotations

import functools
import itertools
import textwrap
import types
import typing
from dataclasses import MISSING, fields
from typing import Any, Literal, get_args

import numpy as np

from costmodel.specs import checks


def choices_of(cls: type, name: str) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal``-typed field (None for other fields)."""
    return _literal_fields(cls).get(name)


@functools.cache
def _literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    """Field -> choices of a spec class's ``Literal`` fields (type hints resolved once:
    ``typing.get_type_hints`` costs ~0.3 ms, and specs are built in loops)."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        if typing.get_origin(hint) in (types.UnionType, typing.Union):  # Literal[...] | None
            hint = next((a for a in get_args(hint) if a is not type(None)), hint)
        if typing.get_origin(hint) is Literal:
            out[name] = get_args(hint)
    return out


def plain_scalars(spec: Any) -> None:
    """Every numpy scalar field of a (frozen) spec as the Python number it holds: numpy's
    fixed-width integers overflow silently in the formulas (a batch of np.int64(2048) x
    8,192 tokens of Llama-3-405B's 3.4e16 FLOPs a sequence wrapped past 2^63: a probe),
    Python's do not. Arrays (a sweep's grids) are left as they are."""
    for f in fields(spec):
        value = getattr(spec, f.name)
        if isinstance(value, np.generic) and not isinstance(value, np.str_):
            object.__setattr__(spec, f.name, value.item())


def check_fields(spec: Any, integers: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> None:
    """Numpy scalars as Python numbers (:func:`plain_scalars`), then integers >= 1, flags,
    and every ``Literal`` field against its choices."""
    plain_scalars(spec)
    for name in integers:
        checks.integer(name, getattr(spec, name))
    for name in flags:
        checks.flag(name, getattr(spec, name))
    for name, options in _literal_fields(type(spec)).items():
        checks.choice(name, getattr(spec, name), options)


@functools.cache
def _module_tree(path: str) -> Any:
    """The parsed source of one module (each spec module is read once a process)."""
    import ast
    from pathlib import Path

    return ast.parse(Path(path).read_text(encoding="utf-8"))


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> first sentence of its docstring (for CLI help and the app). The class
    is found in its module's parsed source by name: ``inspect.getsource`` of a class
    re-parses the module to find it, 15-36 ms a spec, twice at import (help and inputs)."""
    import ast
    import inspect

    tree = _module_tree(inspect.getsourcefile(cls))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    for item, nxt in itertools.pairwise(node.body):
        if isinstance(item, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            docs[item.target.id] = " ".join(str(nxt.value.value).split())  # type: ignore[attr-defined]
    return docs


def document_fields(cls: type) -> None:
    """Append a "Fields" section to ``cls.__doc__`` from the attribute docstrings (Python
    drops those; ``help(cls)`` then shows each field with its type and default)."""
    docs, lines = field_docs(cls), ["", "Fields", "------"]
    for f in fields(cls):
        default = "" if f.default is MISSING else f" = {f.default!r}"
        lines.append(f"{f.name}: {f.type}{default}")
        if f.name in docs:
            lines.extend(textwrap.wrap(docs[f.name], 84, initial_indent="    ",
                                       subsequent_indent="    "))  # fmt: skip
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines)
