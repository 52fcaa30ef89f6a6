"""``python -m validate.published --resume`` continues an interrupted run exactly: the runs
it finished are kept (not predicted again), a torn last line is dropped, an edited run is
predicted again, and the rows equal those of a run that was never interrupted (issue 38)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import validate.published.__main__ as published
from validate.published.compare import rows_for

DATA = Path(__file__).parent.parent / "validate" / "published" / "data" / "runs.json"


@pytest.fixture
def corpus(tmp_path) -> Path:
    data = json.loads(DATA.read_text())
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({**data, "runs": data["runs"][:5]}))
    return path


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def _counting(monkeypatch, stop_at: int = 0) -> list[str]:
    """Replace rows_for by one that records each run it predicts (and is interrupted, as
    by Ctrl-C, when asked for run number ``stop_at``)."""
    seen: list[str] = []

    def wrapped(run):
        if stop_at and len(seen) + 1 == stop_at:
            raise KeyboardInterrupt
        seen.append(run["id"])
        return rows_for(run)

    monkeypatch.setattr(published, "rows_for", wrapped)
    return seen


def test_an_interrupted_run_resumes_exactly(corpus, tmp_path, monkeypatch, capsys):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert published.main(["--runs", str(corpus), "--out", str(whole)]) == 0
    _counting(monkeypatch, stop_at=4)
    with pytest.raises(KeyboardInterrupt):
        published.main(["--runs", str(corpus), "--out", str(cut)])
    with (cut / "rows.jsonl").open("a") as f:
        f.write('{"case": "torn')  # a line cut by the kill
    seen = _counting(monkeypatch)
    assert published.main(["--runs", str(corpus), "--out", str(cut), "--resume"]) == 0
    ids = [r["id"] for r in json.loads(corpus.read_text())["runs"]]
    assert seen == ids[3:]  # the three finished runs were kept
    assert _rows(cut) == _rows(whole)
    assert (cut / "report.md").read_text() == (whole / "report.md").read_text()
    assert "kept (--resume)" in capsys.readouterr().err


def test_an_edited_run_is_predicted_again_and_no_resume_starts_over(corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert published.main(["--runs", str(corpus), "--out", str(out)]) == 0
    data = json.loads(corpus.read_text())
    data["runs"][1]["notes"] = "edited after the run"
    corpus.write_text(json.dumps(data))
    seen = _counting(monkeypatch)
    assert published.main(["--runs", str(corpus), "--out", str(out), "--resume"]) == 0
    assert seen == [data["runs"][1]["id"]]
    seen.clear()
    assert published.main(["--runs", str(corpus), "--out", str(out)]) == 0
    assert len(seen) == 5
