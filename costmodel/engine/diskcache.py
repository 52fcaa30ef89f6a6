"""Lambdified functions kept on disk, so a new process skips sympy's code printing.

Building and printing one structure's expressions takes ~0.3 s; a layout search touches
dozens of structures, so a cold ``plan`` spends its time here, not in numpy. The printed
source of each function is stored under ``$COSTMODEL_CACHE`` (default
``~/.cache/costmodel``; ``off`` disables it), keyed by a digest of everything that could
change it: the costmodel package's source files, the sympy, numpy and Python versions, the
structure, the requested keys and the argument symbols. An entry is written only when its
globals are exactly those of a fresh numpy namespace (checked object by object), so a
loaded function is the function sympy would have built. An entry is executed only when it
and its folder belong to this user and no one else can write them. Unreadable, corrupt or
untrusted entries are rebuilt; an unwritable cache folder only costs the speed-up.
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import json
import marshal
import os
import platform
import tempfile
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sympy as sp

from costmodel.symbols.algebra import Var

_PACKAGE = Path(__file__).resolve().parents[1]


def cache_dir() -> Path | None:
    """The cache folder, or None when ``COSTMODEL_CACHE=off``."""
    setting = os.environ.get("COSTMODEL_CACHE", "")
    if setting.lower() == "off":
        return None
    if setting:
        return Path(setting)
    try:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:  # no home directory (a bare container user): no cache
        return None
    return Path(base) / "costmodel"


@functools.cache
def _code_digest() -> str:
    """One digest of every source file of the package (any edit invalidates the cache)."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        h.update(path.relative_to(_PACKAGE).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


MODULES: dict[str, Any] = {"numpy": "numpy", "scalar": [{"Max": max}, "math"]}
"""The kinds of function kept: numpy (arrays) and scalar (Python's math on exact ints and
floats, ``Max`` the builtin ``max``), as ``sp.lambdify``'s ``modules``."""


@functools.cache
def _namespace(kind: str = "numpy") -> dict[str, Any]:
    """The globals sympy gives a lambdify of this kind (plus functools.reduce for Max/Min)."""
    ns = dict(sp.lambdify([], 0, modules=MODULES[kind]).__globals__)
    ns["reduce"] = functools.reduce
    return ns


def _globals(code: Any, kind: str, defined: str) -> dict[str, Any]:
    """Globals for a loaded function, each bound as in :func:`_namespace` (where it reads
    one that is not, the whole namespace). numpy's public names, but numpy.linalg's (which
    sympy's star-imports rebind), are taken as attributes: building the namespace
    star-imports numpy's lazy submodules, 0.06-0.13 s of a new process's first plan."""
    if kind != "numpy":
        return dict(_namespace(kind))
    names = set(_read_names(code)) - {defined, "reduce"}
    if not names <= _numpy_public():
        return dict(_namespace(kind))
    return {"reduce": functools.reduce, **{n: getattr(np, n) for n in names}}


@functools.cache
def _numpy_public() -> frozenset[str]:
    return frozenset(np.__all__) - frozenset(np.linalg.__all__)


def _read_names(code: Any) -> Iterator[str]:
    """The global names a code object and the code objects nested in it read."""
    yield from code.co_names
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            yield from _read_names(const)


def _digest(parts: Sequence[Any]) -> str:
    versions = (_code_digest(), sp.__version__, np.__version__, platform.python_version())
    return hashlib.sha256(repr((versions, *parts)).encode()).hexdigest()


def _trusted(path: Path) -> bool:
    """Run only code that this user wrote: the entry and its folder owned by this user and
    writable by nobody else (the rule ssh applies to its keys). Python's own bytecode cache
    trusts its folders the same way; a shared, world-writable folder is never read."""
    if not hasattr(os, "getuid"):  # Windows: ACLs, not modes
        return True
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
    return True


def _exists(path: Path) -> bool:
    """Whether a cache entry is there; False where its folder cannot be entered (a
    PermissionError from ``stat``): the cache is then skipped, never an error."""
    try:
        return path.exists()
    except OSError:
        return False


def _load(path: Path, kind: str) -> tuple[tuple[str, ...], Callable[..., Any]] | None:
    """A cached function, or None (absent, corrupt, or not trusted). The source is what
    ``sp.lambdify`` printed for these expressions; its bytecode is stored beside it
    (``marshal``, as Python's own ``.pyc`` files: the key holds the Python version), so a
    new process does not compile it again (a third of a first search's loading)."""
    try:
        if not _trusted(path):
            return None
        entry = json.loads(path.read_text())
        code = (marshal.loads(base64.b64decode(entry["code"])) if "code" in entry
                else compile(entry["source"], str(path), "exec"))  # fmt: skip
        ns = _globals(code, kind, entry["name"])
        exec(code, ns)  # our own, checked by _trusted
        fn = ns[entry["name"]]
        _SOURCES[fn] = entry["source"]
        return tuple(entry["keys"]), fn
    except (OSError, ValueError, KeyError, TypeError, SyntaxError, EOFError):
        return None


def _reproducible(fn: Callable[..., Any], kind: str) -> bool:
    """Every global the function reads is the same object in a fresh namespace."""
    ns, glb = _namespace(kind), fn.__globals__
    return all(ns.get(n, ns) is glb[n] for n in fn.__code__.co_names if n in glb)


def _store(path: Path, keys: tuple[str, ...], fn: Callable[..., Any], kind: str) -> None:
    if fn in _SOURCES:
        source = _SOURCES[fn]
        code = base64.b64encode(marshal.dumps(compile(source, str(path), "exec"))).decode()
        _write(path, {"keys": list(keys), "name": fn.__name__, "source": source, "code": code})


def _write(path: Path, entry: Any) -> None:
    """Write atomically (a reader sees the old entry or the new one, never half of one);
    an unwritable folder only costs the speed-up."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as tmp:
            json.dump(entry, tmp)
        os.replace(tmp.name, path)
    except OSError:
        return


def lambdify(args: Sequence[sp.Symbol], exprs: Any, kind: str = "numpy") -> Callable[..., Any]:
    """``sp.lambdify`` with common subexpressions shared (``cse``), built unevaluated:
    cse rebuilds every node from its new arguments, and a rebuilt ``Max``/``Min``
    re-runs sympy's pairwise simplification of its arguments (``_find_localzeros``),
    which took over half of a cold structure's compile (1.25 of 2.2 s under tp x pp) and
    changes nothing the function computes (the expressions were evaluated when built;
    1,723 estimate values over 12 layouts are bit-identical either way). sympy's
    evaluate flag is thread-local, so the app's other sessions are not touched."""
    args = [a.sym if isinstance(a, Var) else a for a in args]
    with sp.core.parameters.evaluate(False):
        return sp.lambdify(args, exprs, modules=MODULES[kind], cse=_shared,
                           printer=_printer(kind), use_imps=False)  # fmt: skip


def _printer(kind: str) -> Any:
    """The printer ``sp.lambdify`` picks for ``kind`` with its settings, printing sums and
    products in their arguments' order (``order="none"``): the canonical order sorts
    every Add's terms by their node counts, a fifth of the printing's time."""
    from sympy.printing.numpy import NumPyPrinter
    from sympy.printing.pycode import PythonCodePrinter

    user = {k: k for m in MODULES[kind] if isinstance(m, dict) for k in m}
    settings = {"fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True,
                "user_functions": user, "order": "none"}  # fmt: skip
    return (NumPyPrinter if kind == "numpy" else PythonCodePrinter)(settings)


def _shared(exprs: Any) -> tuple[list[tuple[sp.Symbol, sp.Expr]], Any]:
    """The subexpressions the expressions share, as sympy's ``cse`` finds them but without
    its ``opt_cse`` pass (``tree_cse`` alone, in the expressions' own order): the formulas
    call the same helpers, so their expressions already share whole subtrees (901 unique
    nodes in the 355,421 of a Llama-3-70B tp x pp structure), and ``opt_cse``'s search for
    common factors of products and sums took three quarters of ``cse``'s time (7.9 of 10.9
    s of a cold profiled plan) for functions no faster to run: Llama-3-70B tp 8 x pp 2
    evaluates 100,000 layouts in 0.19 s, against 0.24 s with it; estimates move by at most
    2 ulp (``tests/test_diskcache_code.py`` holds them to sympy's own ``cse``)."""
    from sympy.simplify.cse_main import tree_cse
    from sympy.utilities.iterables import numbered_symbols

    return tree_cse(list(exprs), numbered_symbols("x", cls=sp.Symbol), {}, "none", ())


@functools.lru_cache(maxsize=16)
def _symbol_names(args: tuple[sp.Symbol, ...]) -> tuple[str, ...]:
    """The symbols' names (printing ~600 symbols per lookup was a tenth of a warm plan)."""
    return tuple(map(str, args))


def on_disk(parts: Sequence[Any], args: Sequence[sp.Symbol], kind: str = "numpy") -> bool:
    """Whether :func:`lambdify_cached` would load ``parts`` from disk (not build them)."""
    folder = cache_dir()
    name = f"{_digest((kind, *parts, _symbol_names(tuple(args))))}.json"
    return folder is not None and _exists(folder / name)


def _lookup(key: tuple, kind: str) -> tuple[Path | None, Any]:
    """(the cache file of ``key`` or None without a cache, the function stored there or
    None)."""
    folder = cache_dir()
    if folder is None:
        return None, None
    path = folder / f"{_digest(key)}.json"
    return path, _load(path, kind) if _exists(path) else None


def lambdify_cached(
    parts: Sequence[Any],
    build: Callable[[], tuple[tuple[str, ...], list[sp.Expr]]],
    args: Sequence[sp.Symbol],
    kind: str = "numpy",
) -> tuple[tuple[str, ...], Callable[..., Any]]:
    """``(keys, fn)``: a function of ``args`` (of ``kind``: :data:`MODULES`) returning the
    expressions ``build()`` gives, loaded from disk when ``parts`` (what identifies them)
    was built before, so that neither the expressions nor their printing are redone."""
    path, hit = _lookup((kind, *parts, _symbol_names(tuple(args))), kind)
    if hit is not None:
        return hit
    keys, exprs = build()
    fn = lambdify(args, exprs, kind)
    if _reproducible(fn, kind):
        import inspect

        _SOURCES[fn] = inspect.getsource(fn)
    if path is not None:
        _store(path, keys, fn, kind)
    return keys, fn


def json_cached(parts: Sequence[Any], build: Callable[[], Any]) -> Any:
    """What ``build()`` returns (plain JSON data: no code is run on load), kept on disk
    under the same key rules as :func:`lambdify_cached`: for what is derived from a
    structure's expressions but is not a function of them (the Formulas tab's sizes, LaTeX
    and symbols), so that a structure met before costs no sympy at all."""
    folder = cache_dir()
    path = None if folder is None else folder / f"{_digest(('json', *parts))}.json"
    if path is not None and _exists(path):
        try:
            if _trusted(path):
                return json.loads(path.read_text())["data"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    data = json.loads(json.dumps(build()))  # a hit and a miss give the same types
    if path is not None:
        _write(path, {"data": data})
    return data


_SOURCES: weakref.WeakKeyDictionary[Callable[..., Any], str] = weakref.WeakKeyDictionary()
"""The printed source of each function built or loaded here whose globals are a fresh
namespace's (what :func:`projected` cuts from)."""


def projected(
    keys: Sequence[str], fn: Callable[..., Any], wanted: Sequence[str], kind: str = "numpy"
) -> tuple[tuple[str, ...], Callable[..., Any]]:
    """``(present, fn)``: the function of those ``wanted`` that ``keys`` (what ``fn``
    returns, in order) holds, cut from ``fn``'s printed source without sympy: its return
    list kept at their positions, and of its shared subexpressions (``x0 = ...``) only
    those they read, backwards. Each kept line is ``fn``'s own, so each value is
    bit-identical to ``fn``'s. A function of unknown source is wrapped instead."""
    present = tuple(k for k in wanted if k in keys)
    index = [list(keys).index(k) for k in present]
    source = _SOURCES.get(fn)
    if source is None:
        return present, lambda *a: [fn(*a)[i] for i in index]
    tree = ast.parse(source)
    func = tree.body[0]
    assert isinstance(func, ast.FunctionDef) and isinstance(func.body[-1], ast.Return)
    returned = func.body[-1].value
    assert isinstance(returned, ast.List | ast.Tuple)
    returned.elts = [returned.elts[i] for i in index]
    needed = _names(returned)
    kept: list[ast.stmt] = []
    for stmt in reversed(func.body[:-1]):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        named = [t.id for t in targets if isinstance(t, ast.Name)]
        if len(named) == len(targets) and named and not needed & set(named):
            continue  # a subexpression none of the kept values reads
        kept.append(stmt)
        needed |= _names(stmt)
    func.body = [*reversed(kept), func.body[-1]]
    code = compile(ast.fix_missing_locations(tree), "<costmodel projection>", "exec")
    ns = _globals(code, kind, func.name)
    exec(code, ns)
    _SOURCES[ns[func.name]] = ast.unparse(tree)
    return present, ns[func.name]


def projected_cached(
    parts: Sequence[Any], keys: Sequence[str], fn: Callable[..., Any], wanted: Sequence[str],
    kind: str = "numpy",
) -> tuple[tuple[str, ...], Callable[..., Any]]:  # fmt: skip
    """:func:`projected`, kept on disk under ``parts`` (what identifies ``fn``) as
    :func:`lambdify_cached` keeps what it builds: a new process loads the cut function
    (compiling its source) instead of cutting it again (parsing and walking ``fn``'s)."""
    path, hit = _lookup((kind, "projected", *parts, tuple(wanted)), kind)
    if hit is not None:
        return hit
    present, cut = projected(keys, fn, wanted, kind)
    if path is not None:
        _store(path, present, cut, kind)
    return present, cut


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
