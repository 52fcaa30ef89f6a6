"""The disk cache keeps each function's bytecode beside its source: a new process loads
it without compiling, gets the same numbers, and a damaged entry is rebuilt, never run."""

from __future__ import annotations

import json

import numpy as np
import sympy as sp

from costmodel.engine import diskcache


def _cached(builds: list[int]):
    x, y = sp.symbols("x y")

    def build():
        builds.append(1)
        return ("sum", "prod"), [x + y, x * sp.Max(x, y)]

    return diskcache.lambdify_cached(("test-entry", 1), build, (x, y))


def test_a_stored_function_loads_from_its_bytecode(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    builds: list[int] = []
    keys, built = _cached(builds)
    (entry,) = tmp_path.glob("*.json")
    assert "code" in json.loads(entry.read_text())
    keys_again, loaded = _cached(builds)
    assert builds == [1] and keys_again == keys  # the second came from disk
    a, b = np.array([1.0, 3.0]), np.array([2.0, -1.0])
    for got, want in zip(loaded(a, b), built(a, b), strict=True):
        assert np.array_equal(got, want)


def test_a_damaged_bytecode_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    builds: list[int] = []
    _cached(builds)
    (entry,) = tmp_path.glob("*.json")
    data = json.loads(entry.read_text())
    data["code"] = "bm90IGJ5dGVjb2Rl"  # base64 of text that is not marshal data
    entry.write_text(json.dumps(data))
    _, fn = _cached(builds)
    assert builds == [1, 1]  # refused, built again
    assert np.array_equal(fn(np.array([2.0]), np.array([5.0]))[0], [7.0])
