"""The app's background warm-up (``explorer.warmup``) and the disk cache of plain data it
fills (``costmodel.engine.diskcache.json_cached``): a structure warmed once is read from
disk in any later process, with the same numbers and no sympy."""

from __future__ import annotations

import json

import pytest

from costmodel.engine import diskcache, quantities
from costmodel.engine.fit import budget_bytes
from explorer import warmup
from explorer.formulas import formula_rows
from explorer.inverse import full_min_fsdp
from explorer.state import START, setup_of

VALUES = {**START, "model": "cs336-small", "gpus": 2, "batch": 4, "seq": 256}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    caches = (quantities.compiled, quantities.compiled_scalar, quantities.compiled_subset)
    for c in caches:
        c.cache_clear()
    yield tmp_path
    for c in caches:  # nothing built from this folder outlives it
        c.cache_clear()


def test_plain_data_is_kept_and_a_corrupt_or_foreign_entry_rebuilt(cache, monkeypatch):
    calls = []

    def build():
        calls.append(1)
        return {"a": (1, 2), "b": None}

    first = diskcache.json_cached(("t", 1), build)
    assert first == diskcache.json_cached(("t", 1), build) == {"a": [1, 2], "b": None}
    assert len(calls) == 1  # the second came from disk, with the types the first had
    (entry,) = cache.glob("*.json")
    entry.write_text("{not json")
    assert diskcache.json_cached(("t", 1), build) == first and len(calls) == 2
    entry.chmod(0o666)  # writable by others: never read
    assert diskcache.json_cached(("t", 1), build) == first and len(calls) == 3


def test_warmed_neighbours_cost_no_sympy_later(cache, monkeypatch):
    current, _ = setup_of(VALUES)
    done = warmup.warm(VALUES, fields=("precision",))
    here = quantities.structure_of(current.model, current.train, current.parallel)
    assert done and here not in done and len(set(done)) == len(done)
    caches = (quantities.compiled, quantities.compiled_scalar, quantities.compiled_subset)
    for c in caches:  # a new process: only the disk is left
        c.cache_clear()
    want = {}
    for values in warmup.neighbours(VALUES, ("precision",)):
        setup, _ = setup_of(values)
        if setup is not None:
            want[values["precision"]] = setup.estimate().values

    def no_sympy(structure):
        raise AssertionError("a warmed structure was built again")

    monkeypatch.setattr(quantities, "compiled", no_sympy)
    monkeypatch.setattr("explorer.formulas.compiled", no_sympy)
    for c in caches:
        c.cache_clear()
    for values in warmup.neighbours(VALUES, ("precision",)):
        setup, _ = setup_of(values)
        if setup is None:
            continue
        assert setup.estimate().values == want[values["precision"]]
        rows = formula_rows(quantities.structure_of(setup.model, setup.train, setup.parallel))
        assert rows["time_s.step"]["size"] > 0
        assert full_min_fsdp(setup, budget_bytes(setup.hardware))["fsdp"] is not None


def test_one_warm_up_per_structure_and_one_at_a_time(cache, monkeypatch):
    started = []

    class Process:
        def __init__(self, args, **kwargs):
            started.append(args)
            self.stdin, self.running = self, True

        def write(self, data):
            self.sent = json.loads(data)

        def close(self):
            pass

        def poll(self):
            return None if self.running else 0

    monkeypatch.setenv("COSTMODEL_WARMUP", "on")
    monkeypatch.setattr(warmup.subprocess, "Popen", Process)
    monkeypatch.setattr(warmup, "_handed", set())
    monkeypatch.setattr(warmup, "_process", None)
    setup, _ = setup_of(VALUES)
    other, _ = setup_of({**VALUES, "recompute": "full"})
    assert warmup.start(VALUES, setup)
    assert warmup._process.sent["model"] == "cs336-small"
    assert not warmup.start({**VALUES, "recompute": "full"}, other)  # one is running
    warmup._process.running = False
    assert not warmup.start(VALUES, setup)  # this structure's neighbours were handed out
    assert warmup.start({**VALUES, "recompute": "full"}, other)
    assert len(started) == 2 and started[0][1:] == ["-m", "explorer.warmup"]
    assert (warmup.ROOT / "explorer" / "warmup.py").is_file()  # runs from anywhere
    monkeypatch.setenv("COSTMODEL_WARMUP", "off")
    monkeypatch.setattr(warmup, "_handed", set())
    assert not warmup.start(VALUES, setup)


def test_a_warm_up_that_cannot_start_is_no_error(cache, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setenv("COSTMODEL_WARMUP", "on")
    monkeypatch.setattr(warmup.subprocess, "Popen", refuse)
    monkeypatch.setattr(warmup, "_handed", set())
    monkeypatch.setattr(warmup, "_process", None)
    setup, _ = setup_of(VALUES)
    assert not warmup.start(VALUES, setup)
    assert not warmup._handed  # tried again on the next page run
    assert not warmup.start({**VALUES, "batch": object()}, setup)  # not JSON: skipped
