"""The practice check: each published run's own layout ranked in the plan for its model
and cluster, written incrementally and resumed."""

from __future__ import annotations

import json

from validate.published.corpus import case_of, load_runs
from validate.published.practice import main, practice_row

IDS = ("mosaic-mpt7b-h100_80gb-8gpu-seq2048", "tt-8b-8gpu-fsdp")


def _runs():
    return [r for r in load_runs() if r["id"] in IDS]


def test_the_authors_layout_is_placed_among_the_plans():
    for run in _runs()[:1]:  # (both runs are placed again by the resume test below)
        row = practice_row(case_of(run))
        assert row["status"] == "ok"
        assert 1 <= row["rank"] <= row["fitting"] <= row["valid"]
        assert row["best_step_s"] <= row["authors_step_s"] * 1.005  # the best is the best
        assert row["gap"] == row["authors_step_s"] / row["best_step_s"] - 1
        assert row["authors"].startswith("fsdp2 dp1 fsdp8")


def test_results_are_written_per_run_and_resumed(tmp_path, capsys):
    corpus = tmp_path / "runs.json"
    corpus.write_text(json.dumps({"runs": _runs()}))
    out = tmp_path / "out"
    assert main(["--runs", str(corpus), "--out", str(out)]) == 0
    lines = (out / "practice.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["case"] for x in lines) == sorted(IDS)
    assert "runs ranked" in (out / "practice.md").read_text()
    kept = [x for x in lines if IDS[0] not in x]
    (out / "practice.jsonl").write_text("\n".join(kept) + '\n{"case": "cut off')  # interrupted
    capsys.readouterr()
    assert main(["--runs", str(corpus), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert IDS[0] in err and IDS[1] not in err  # only the missing run is redone
    rows = [json.loads(x) for x in (out / "practice.jsonl").read_text().splitlines()[:1]]
    rows += [json.loads(x) for x in (out / "practice.jsonl").read_text().splitlines()[2:]]
    assert sorted(r["case"] for r in rows) == sorted(IDS)
