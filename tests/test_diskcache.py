"""Numbers never import sympy (issue 58); the app's Formulas tab keeps what sympy printed
on disk as plain data (``costmodel.engine.diskcache.json_cached``), never run, read back in
any later process without sympy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from costmodel.engine import diskcache, quantities
from explorer.formulas import formula_rows
from explorer.state import START, setup_of

NUMBERS_ONLY = """
import sys
import numpy as np
import costmodel as cm
from costmodel.cli import main
est = cm.estimate("llama3-70b", hardware="h100-sxm", gpus=64, tp=8, pp=2, seq=8192, batch=64,
                  framework="megatron")
assert est["time_s.step"] > 0 and isinstance(est["params.total"], int)
best = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=4096)
grid = cm.sweep("mixtral-8x7b", hardware="h100-sxm", batch=64, seq=4096, framework="fsdp2",
                fsdp=np.array([8, 16, 32]), ep=8)
assert len(best.order) and np.isfinite(grid["time_s.step"]).all()
assert main(["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8"]) == 0
import explorer.pages, explorer.plan_page, explorer.serving  # the app's pages
from costmodel.book.bounds import bounds_report
book = bounds_report(cm.get_model("llama3-70b"), cm.ParallelSpec(fsdp=8, tp=8),
                     cm.get_hardware("h100-sxm"), latex=False)
assert book["critical_batch_tokens"] > 0 and "latex" not in book
print("sympy" in sys.modules)
"""


def test_numbers_never_import_sympy():
    """An estimate, a plan, a sweep, the CLI's estimate, the app's pages and the book's
    bounds in a fresh process: the formulas compute the numbers, and sympy is never
    imported (the app's first view imported it for the book's B* in LaTeX: 0.34 s)."""
    out = subprocess.run([sys.executable, "-c", NUMBERS_ONLY], capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout[-2000:]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    quantities.expressions.cache_clear()
    yield tmp_path
    quantities.expressions.cache_clear()


def test_plain_data_is_kept_and_a_corrupt_or_foreign_entry_rebuilt(cache):
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


def test_the_formulas_tab_reads_a_structure_met_before_without_sympy(cache, monkeypatch):
    setup, _ = setup_of({**START, "model": "cs336-small", "gpus": 2, "batch": 4, "seq": 256})
    structure = quantities.structure_of(setup.model, setup.train, setup.parallel)
    first = formula_rows(structure)

    def no_sympy(structure):
        raise AssertionError("a structure on disk was built again")

    monkeypatch.setattr("explorer.formulas.expressions", no_sympy)
    assert formula_rows(structure) == first and first["time_s.step"]["size"] > 0


def test_the_disk_cache_can_be_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTMODEL_CACHE", "off")
    assert diskcache.cache_dir() is None
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    assert diskcache.cache_dir() == tmp_path


def test_no_home_directory_means_no_cache(monkeypatch):
    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("COSTMODEL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(diskcache.Path, "home", staticmethod(no_home))
    assert diskcache.cache_dir() is None


def test_a_cache_folder_that_cannot_be_entered_is_skipped(tmp_path, monkeypatch):
    """issue 38: a cache folder without search permission raised PermissionError from
    ``stat``; the data is built without the cache instead (root ignores modes, so the
    refusal is the one the OS raises, given to ``Path.exists`` directly)."""
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path / "locked"))
    real = diskcache.Path.exists

    def exists(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "locked")):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(diskcache.Path, "exists", exists)
    assert diskcache.json_cached(("t", 2), lambda: [1, 2]) == [1, 2]
