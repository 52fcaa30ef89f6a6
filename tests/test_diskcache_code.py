"""The disk cache keeps each function's bytecode beside its source: a new process loads
it without compiling, gets the same numbers, and a damaged entry is rebuilt, never run."""

from __future__ import annotations

import json

import numpy as np
import pytest
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


def test_a_loaded_function_reads_the_globals_lambdify_would_give_it(tmp_path, monkeypatch):
    """Loading binds only the names the code reads, each to the object sympy's whole
    numpy namespace holds (numpy.linalg's rebound names and unknown ones take that whole
    namespace)."""
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    x, y = sp.symbols("x y")
    exprs = [sp.floor(x / y), sp.ceiling(x) + sp.log(y), sp.Max(x, y), sp.Min(x, y), sp.Mod(x, y)]
    built = diskcache.lambdify_cached(("test-globals", 1), lambda: (("a",) * 5, exprs), (x, y))
    _, loaded = diskcache.lambdify_cached(("test-globals", 1), lambda: 1 / 0, (x, y))
    whole = diskcache._namespace("numpy")
    assert loaded is not built[1] and len(loaded.__globals__) < len(whole) / 10  # from disk
    read = [n for n in loaded.__code__.co_names if n in loaded.__globals__]
    assert {"floor", "ceil", "log", "maximum", "minimum", "mod"} <= set(read)
    assert all(loaded.__globals__[n] is whole[n] for n in read)
    a, b = np.array([7.0, 3.5]), np.array([2.0, 4.0])
    for got, want in zip(loaded(a, b), built[1](a, b), strict=True):
        assert np.array_equal(got, want)
    trace = compile("def f(a):\n    return trace(a)\n", "<test>", "exec")  # numpy.linalg's
    assert diskcache._globals(trace, "numpy", "f")["trace"] is whole["trace"]


@pytest.mark.parametrize(
    ("model", "layout"),
    [("llama3-70b", {"tp": 8, "pp": 2, "dp": 4, "framework": "megatron",
                     "sequence_parallel": True}),
     ("mixtral-8x7b", {"tp": 2, "dp": 4, "ep": 4, "framework": "megatron"}),
     ("gemma-2-2b", {"fsdp": 8, "framework": "fsdp2"})],
)  # fmt: skip
def test_the_shared_subexpressions_compute_what_sympys_cse_does(model, layout):
    """``diskcache._shared`` is ``tree_cse`` without sympy's ``opt_cse`` pass: the same
    quantities to within a few ulp (float sums in another order), exact integers exact."""
    from costmodel.catalog.hardware import get_hardware
    from costmodel.catalog.presets import get_model
    from costmodel.engine.estimate import symbol_values
    from costmodel.engine.quantities import EVAL_SYMBOLS, compiled, structure_of
    from costmodel.specs.model import TrainSpec
    from costmodel.specs.parallel import ParallelSpec

    m, train, par = get_model(model), TrainSpec(seq=4096, batch=64), ParallelSpec(**layout)
    comp = compiled(structure_of(m, train, par))
    values = symbol_values(m, train, par, get_hardware("h100-sxm"))
    args = [values[s] for s in EVAL_SYMBOLS]
    ours = diskcache.lambdify(EVAL_SYMBOLS, comp.exprs, "scalar")(*args)
    with sp.core.parameters.evaluate(False):
        theirs = sp.lambdify(list(EVAL_SYMBOLS), comp.exprs, modules=diskcache.MODULES["scalar"],
                             cse=True)(*args)  # fmt: skip
    for key, a, b in zip(comp.keys, ours, theirs, strict=True):
        if isinstance(b, int) and isinstance(a, int):
            assert a == b, key
        else:
            assert float(a) == pytest.approx(float(b), rel=1e-15, abs=0), key
