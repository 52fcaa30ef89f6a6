"""The predicted step timeline adds up to the predicted step, lane by lane; the on-disk
cache of compiled functions returns what sympy would build."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET

import pytest

from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.cli.timeline import svg, write_timeline
from costmodel.engine.estimate import estimate
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
