"""Plain data derived from sympy kept on disk, so that a new process skips sympy.

The app's Formulas tab shows a structure's expressions as LaTeX: building and printing
them takes sympy seconds, so what it shows is stored as JSON under ``$COSTMODEL_CACHE``
(default ``~/.cache/costmodel``; ``off`` disables it), keyed by a digest of everything that
could change it: the costmodel package's source files, the sympy, numpy and Python
versions and the structure. Nothing stored is ever executed; entries another user could
have written are not read; unreadable or corrupt entries are rebuilt, and an unwritable
folder only costs the speed-up. (Numbers need none of this: the formulas compute them
directly, ``costmodel.symbols.algebra``.)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

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


def _digest(parts: Sequence[Any]) -> str:
    versions = (_code_digest(), version("sympy"), version("numpy"), platform.python_version())
    return hashlib.sha256(repr((versions, *parts)).encode()).hexdigest()


def _trusted(path: Path) -> bool:
    """Read only what this user wrote: the entry and its folder owned by this user and
    writable by nobody else (the rule ssh applies to its keys); a shared, world-writable
    folder is never read."""
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


def _exists(path: Path) -> bool:
    """Whether a cache entry is there; False where its folder cannot be entered (a
    PermissionError from ``stat``): the cache is then skipped, never an error."""
    try:
        return path.exists()
    except OSError:
        return False


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


def json_cached(parts: Sequence[Any], build: Callable[[], Any]) -> Any:
    """What ``build()`` returns (plain JSON data: no code is run on load), kept on disk
    under ``parts`` (the Formulas tab's sizes, LaTeX and symbols of a structure's
    expressions), so that a structure met before costs no sympy at all."""
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
