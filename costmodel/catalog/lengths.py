"""Sequence-length distributions: a file of lengths or a histogram, or a named synthetic one.

Files: ``.npy`` (a 1-D integer array), or text with one length per line, or one
``length count`` (or ``length,count``) pair per line, a histogram; blank lines and ``#``
comments are skipped. Synthetic: ``name:key=value,...`` with ``lognormal`` (median,
sigma), ``uniform`` (low, high), ``exponential`` (mean) or ``fixed`` (length), sampled
with a seed, rounded to integers and clipped to [1, max_len]. Nothing is evaluated: values
are parsed as numbers.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.catalog.files import read_bytes
from costmodel.specs import checks
from costmodel.specs.checks import SpecError

SYNTHETIC: dict[str, tuple[str, ...]] = {
    "lognormal": ("median", "sigma"),
    "uniform": ("low", "high"),
    "exponential": ("mean",),
    "fixed": ("length",),
}


MAX_SEQUENCES = 2**24
"""The most sequences a file, a histogram or a synthetic draw may hold (128 MiB of int64
lengths)."""
MAX_FILE_BYTES = 128 * 2**20
"""The largest lengths file read (16 M lengths of up to 7 digits, one a line)."""


def check_lengths(lengths: Any, field: str = "lengths") -> np.ndarray:
    """A non-empty 1-D array of positive integer lengths, or a SpecError naming ``field``."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise SpecError(field, f"{field} must be a non-empty list of sequence lengths")
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise SpecError(field, f"{field} must hold integers (got dtype {arr.dtype})")
    checks.integer(field, arr.astype(np.int64), minimum=1)
    return arr.astype(np.int64)


def read_lengths(path: str | Path) -> np.ndarray:
    """Lengths from a ``.npy`` file or a text list / histogram (see the module docstring):
    a regular file of at most ``MAX_FILE_BYTES``, at most ``MAX_SEQUENCES`` lengths."""
    p = Path(path)
    data = read_bytes(p, "lengths", MAX_FILE_BYTES)
    if len(data) > MAX_FILE_BYTES:
        raise SpecError("lengths", f"lengths file {p.name} is larger than "
                        f"{MAX_FILE_BYTES // 2**20} MiB: give a histogram ('length count' "
                        "lines)")  # fmt: skip
    if p.suffix == ".npy":
        try:
            arr = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            raise SpecError(
                "lengths", f"lengths file {p.name}: not a numpy array ({err})"
            ) from None
        return _bounded(check_lengths(arr, "lengths"), p)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError("lengths", f"lengths file {p.name} is not UTF-8 text (byte "
                        f"{data[err.start]:#04x} at offset {err.start})") from None  # fmt: skip
    if _plain(text):  # one bare length a line: parsed in C
        return _bounded(check_lengths(np.array(text.split(), dtype=np.int64), "lengths"), p)
    return _histogram(_rows(text, p.name), p)


def _plain(text: str) -> bool:
    """Digits and line breaks only, no number past 15 digits: one length a line."""
    tokens = text.split()
    return bool(tokens) and set(text) <= _PLAIN and max(map(len, tokens)) <= 15


_PLAIN = set("0123456789\n\r")


def _rows(text: str, name: str) -> list[list[int]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].replace(",", " ").split()
        if not fields:
            continue
        try:
            rows.append([int(x) for x in fields])
        except ValueError:
            raise SpecError("lengths", f"lengths file {name}, line {number}: not an integer "
                            f"({line.strip()!r})") from None  # fmt: skip
        if any(abs(x) > 2**53 for x in rows[-1]):
            raise SpecError("lengths", f"lengths file {name}, line {number}: a number past "
                            "2^53 is no sequence length or count")  # fmt: skip
        if len(rows[-1]) > 2 or len(rows[-1]) != len(rows[0]):
            raise SpecError("lengths", f"lengths file {name}, line {number}: give a length "
                            "or a 'length count' pair on every line")  # fmt: skip
    if not rows:
        raise SpecError("lengths", f"lengths file {name} holds no lengths")
    return rows


def _histogram(rows: list[list[int]], p: Path) -> np.ndarray:
    arr = np.asarray(rows, dtype=np.int64)
    if arr.shape[1] == 1:
        return _bounded(check_lengths(arr[:, 0], "lengths"), p)
    checks.integer("lengths (counts)", arr[:, 1], minimum=0)
    if arr[:, 1].sum() > MAX_SEQUENCES:
        raise SpecError("lengths", f"lengths file {p.name}: its counts add up to "
                        f"{arr[:, 1].sum():,} sequences, more than {MAX_SEQUENCES:,}; scale "
                        "them down (padding depends on their proportions)")  # fmt: skip
    return check_lengths(np.repeat(arr[:, 0], arr[:, 1]), "lengths")


def _bounded(lengths: np.ndarray, p: Path) -> np.ndarray:
    if lengths.size > MAX_SEQUENCES:
        raise SpecError("lengths", f"lengths file {p.name} holds {lengths.size:,} lengths, "
                        f"more than {MAX_SEQUENCES:,}: give a sample or a histogram")  # fmt: skip
    return lengths


def synthetic_lengths(text: str, n: int, max_len: int, seed: int = 0) -> np.ndarray:
    """``n`` lengths of a named distribution, e.g. ``lognormal:median=700,sigma=0.85``."""
    checks.integer("samples", n)
    checks.at_most("samples", n, f"{MAX_SEQUENCES:,}", MAX_SEQUENCES,
                   "(a sample of a distribution; padding depends on its proportions)")  # fmt: skip
    name, _, rest = text.partition(":")
    if name not in SYNTHETIC:
        raise SpecError("distribution", f"distribution must be one of {', '.join(SYNTHETIC)} "
                        f"(got {name!r})")  # fmt: skip
    params = _params(name, rest)
    rng = np.random.default_rng(seed)
    if name == "lognormal":
        draw = params["median"] * np.exp(params["sigma"] * rng.standard_normal(n))
    elif name == "uniform":
        draw = rng.uniform(params["low"], params["high"], n)
    elif name == "exponential":
        draw = rng.exponential(params["mean"], n)
    else:
        draw = np.full(n, params["length"])
    return np.clip(np.round(draw), 1, max_len).astype(np.int64)


def _params(name: str, text: str) -> dict[str, float]:
    want = SYNTHETIC[name]
    params: dict[str, float] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, _, value = item.partition("=")
        if key not in want:
            raise SpecError("distribution", f"{name} takes {', '.join(want)} (got {key!r})")
        try:
            params[key] = float(value)
        except ValueError:
            raise SpecError("distribution", f"{name}: {key} must be a number "
                            f"(got {value!r})") from None  # fmt: skip
        checks.number(f"distribution {key}", params[key])
    missing = [k for k in want if k not in params]
    if missing:
        raise SpecError("distribution", f"{name} needs {', '.join(missing)} (e.g. "
                        f"{name}:{','.join(k + '=1' for k in want)})")  # fmt: skip
    if name == "uniform" and params["low"] > params["high"]:
        raise SpecError("distribution", "uniform: low must be <= high")
    for key, value in params.items():  # a probe: sigma=1e308 overflowed exp, unsaid
        top = MAX_SIGMA if key == "sigma" else 2**24
        if value > top:
            raise SpecError("distribution", f"{name}: {key} must be <= {top:,} (got "
                            f"{value:g}){SIGMA_WHY * (key == 'sigma')}")  # fmt: skip
    return params


MAX_SIGMA = 10
"""The widest lognormal a distribution takes (its lengths' log standard deviation)."""
SIGMA_WHY = ": a spread of e^10, 22,026x, per standard deviation"
