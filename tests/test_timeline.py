"""The predicted step timeline adds up to the predicted step, lane by lane; the on-disk
cache of compiled functions returns what sympy would build."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.cli.timeline import svg, write_timeline
from costmodel.engine import diskcache
from costmodel.engine.estimate import estimate
from costmodel.engine.sweep import sweep
from costmodel.engine.timeline import LANES, segments
from costmodel.specs.checks import SpecError
from costmodel.specs.model import TrainSpec
from costmodel.specs.parallel import ParallelSpec

H100 = get_hardware("h100-sxm")
MODEL = get_model("llama3-8b")
TRAIN = TrainSpec(batch=32, seq=4096, precision="bf16-mixed", grad_accum=4)
LAYOUTS = [
    ParallelSpec(framework="fsdp2", fsdp=8, zero=3),
    ParallelSpec(framework="fsdp2", fsdp=4, tp=2, sequence_parallel=True, overlap="sum"),
    ParallelSpec(framework="megatron", dp=2, tp=2, pp=2, pp_interleave=2, zero=1),
    ParallelSpec(framework="fsdp2", fsdp=2, tp=4, async_tp=True, cp=1),
    ParallelSpec(framework="reference", fsdp=8, zero=1),
    ParallelSpec(framework="reference", dp=8),  # the all-reduce beside the last micro-batch
    ParallelSpec(framework="handwritten", fsdp=8),  # gathers in line, exposed
]


@pytest.mark.parametrize("par", LAYOUTS, ids=lambda p: f"{p.framework}-tp{p.tp}-pp{p.pp}")
def test_segments_add_up_to_the_step(par):
    values = {k: float(v) for k, v in estimate(MODEL, TRAIN, par, H100).values.items()}
    segs = segments(values, par)
    assert max(s.end for s in segs) == pytest.approx(values["time_s.step"], rel=1e-12)
    assert all(s.seconds >= 0 for s in segs)
    compute = sum(s.seconds for s in segs if s.kind == "compute")
    assert compute == pytest.approx(values["time_s.compute"], rel=1e-12)
    comm = sum(s.seconds for s in segs if s.kind in ("comm", "exposed"))
    assert comm == pytest.approx(values["time_s.comm"], rel=1e-12)
    for lane in LANES:  # one stream per lane: no two bars at once
        bars = sorted((s.start, s.end) for s in segs if s.lane == lane)
        assert all(a[1] <= b[0] * (1 + 1e-12) for a, b in itertools.pairwise(bars))
    if par.pp > 1:
        assert any(s.kind == "bubble" for s in segs)
    if par.tp > 1 and not par.async_tp:
        assert any(s.label.startswith("TP") and s.kind == "exposed" for s in segs)


def test_svg_and_html_are_self_contained(tmp_path):
    par = LAYOUTS[2]
    for name in ("t.svg", "t.html"):
        path = write_timeline(str(tmp_path / name), MODEL, TRAIN, par, H100)
        text = path.read_text()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "<script" not in text
    root = ET.fromstring((tmp_path / "t.svg").read_text())
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("pipeline bubble") for t in titles)
    with pytest.raises(SpecError, match="cannot write"):
        write_timeline(str(tmp_path / "missing" / "t.svg"), MODEL, TRAIN, par, H100)
    assert svg([], "empty").startswith("<svg")


def test_the_disk_cache_returns_sympys_function(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    keys = ("time_s.step", "memory_bytes_per_device.peak")
    grid = {"tp": np.array([1, 2, 4]), "fsdp": np.array([8, 4, 2])}
    fresh = sweep(MODEL, hardware=H100, quantities=keys, batch=32, seq=4096, **grid)
    from costmodel.engine.quantities import compiled_subset

    compiled_subset.cache_clear()  # the next call reads the files written above
    entries = list(tmp_path.glob("*.json"))
    assert entries and all(json.loads(p.read_text())["keys"] for p in entries)
    again = sweep(MODEL, hardware=H100, quantities=keys, batch=32, seq=4096, **grid)
    for k in keys:
        assert np.array_equal(fresh[k], again[k])
    for p in entries:  # a corrupt entry is rebuilt, not trusted
        p.write_text("{not json")
    compiled_subset.cache_clear()
    third = sweep(MODEL, hardware=H100, quantities=keys, batch=32, seq=4096, **grid)
    assert np.array_equal(fresh["time_s.step"], third["time_s.step"])
    assert all(json.loads(p.read_text())["source"] for p in entries)
    compiled_subset.cache_clear()


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
    ``stat``; the estimate is built without the cache instead (root ignores modes, so the
    refusal is the one the OS raises, given to ``Path.exists`` directly)."""
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path / "locked"))
    real = diskcache.Path.exists

    def exists(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "locked")):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    from costmodel.engine.quantities import compiled_subset

    compiled_subset.cache_clear()
    monkeypatch.setattr(diskcache.Path, "exists", exists)
    got = sweep(MODEL, hardware=H100, quantities=("time_s.step",), batch=32, seq=4096,
                tp=np.array([1, 2]))  # fmt: skip
    monkeypatch.setattr(diskcache.Path, "exists", real)
    compiled_subset.cache_clear()
    want = sweep(MODEL, hardware=H100, quantities=("time_s.step",), batch=32, seq=4096,
                 tp=np.array([1, 2]))  # fmt: skip
    assert np.array_equal(got["time_s.step"], want["time_s.step"])
    compiled_subset.cache_clear()


def test_a_cache_others_can_write_is_never_run(tmp_path, monkeypatch):
    monkeypatch.setenv("COSTMODEL_CACHE", str(tmp_path))
    from costmodel.engine.quantities import compiled_subset

    keys = ("time_s.step",)
    grid = {"tp": np.array([1, 2])}
    fresh = sweep(MODEL, hardware=H100, quantities=keys, batch=32, seq=4096, **grid)
    entries = list(tmp_path.glob("*.json"))
    assert entries
    for p in entries:  # planted code in an entry someone else could have written
        entry = json.loads(p.read_text())
        entry["source"] = "raise SystemExit('planted')\n" + entry["source"]
        p.write_text(json.dumps(entry))
    tmp_path.chmod(0o777)
    compiled_subset.cache_clear()
    again = sweep(MODEL, hardware=H100, quantities=keys, batch=32, seq=4096, **grid)
    assert np.array_equal(fresh["time_s.step"], again["time_s.step"])
    tmp_path.chmod(0o700)
    compiled_subset.cache_clear()


def test_plan_says_where_it_wrote_the_timeline(tmp_path, capsys):
    """Issue 60's probe: ``plan --timeline`` was silent on success. It names the file on
    stderr, so that --json's output stays JSON."""
    from costmodel.cli import main

    path = tmp_path / "step.svg"
    argv = ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--seq",
            "2048", "--global-batch", "16", "--top", "1", "--json"]  # fmt: skip
    argv += ["--timeline", str(path)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["top"] and path.exists()
    assert f"wrote the best layout's step timeline to {path}" in err
