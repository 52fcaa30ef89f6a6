"""ResultsLog resume against torn and merged lines: a finished case is done only while all its
rows are readable; resume rewrites both files clean; results.jsonl appears with its first row."""

from __future__ import annotations

import json

import torch

from costmodel.catalog.hardware import get_hardware
from validate.report.results import ResultsLog, Row, read_rows
from validate.suites.runner import Case, Context, run_cases

CTX = Context(torch.device("cpu"), "cpu", get_hardware("cpu"))


def _body(name: str, n: int, ran: list[str]):
    def run(ctx: Context):
        ran.append(name)
        for i in range(n):
            yield Row("t", name, f"q{i}", 1.0, 1.0, "cpu", "ok", "s")

    return run


def _cases(ran: list[str]) -> list[Case]:
    return [Case("t", "a", _body("a", 2, ran)), Case("t", "b", _body("b", 1, ran))]


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line parses


def _complete(tmp_path) -> None:
    rows = [(r["case"], r["quantity"]) for r in read_rows(tmp_path)]
    assert sorted(rows) == [("a", "q0"), ("a", "q1"), ("b", "q0")]
    assert {(c["case"], c["rows"]) for c in _lines(tmp_path / "cases.jsonl")} == {
        ("a", 2),
        ("b", 1),
    }


def test_finish_records_the_rows_of_each_case(tmp_path):
    run_cases(_cases([]), CTX, ResultsLog(tmp_path))
    assert [(c["case"], c["rows"]) for c in _lines(tmp_path / "cases.jsonl")] == [
        ("a", 2),
        ("b", 1),
    ]


def test_torn_last_row_reruns_its_case(tmp_path):
    run_cases(_cases([]), CTX, ResultsLog(tmp_path))
    results = tmp_path / "results.jsonl"
    text = results.read_text()
    results.write_text(text[: len(text) - 20])  # killed while b's only row was written
    ran: list[str] = []
    run_cases(_cases(ran), CTX, ResultsLog(tmp_path, resume=True))
    assert ran == ["b"], "a kept all its rows; b lost one and runs again"
    _lines(results)
    _complete(tmp_path)


def test_merged_lines_are_rewritten_away_and_their_cases_rerun(tmp_path):
    run_cases(_cases([]), CTX, ResultsLog(tmp_path))
    results, cases = tmp_path / "results.jsonl", tmp_path / "cases.jsonl"
    lines = results.read_text().splitlines()  # a0, a1, b0
    results.write_text(f"{lines[0]}\n{lines[1][:15]}{lines[2]}\n")  # torn a1 merged with b0
    cases.write_text(cases.read_text() + '{"suite": "t", "case": "c", "sta')  # torn, no newline
    ran: list[str] = []
    log = ResultsLog(tmp_path, resume=True)
    assert _lines(results) == []  # a (1 of 2 rows) and b (0 of 1) both run again
    assert _lines(cases) == []
    run_cases(_cases(ran), CTX, log)
    assert ran == ["a", "b"]
    _complete(tmp_path)


def test_a_case_line_without_a_row_count_is_trusted(tmp_path):
    """cases.jsonl written before counts were kept: today's behaviour, the case is done."""
    (tmp_path / "cases.jsonl").write_text(
        json.dumps({"suite": "t", "case": "a", "status": "ok", "wall_s": 0.1}) + "\n"
    )
    log = ResultsLog(tmp_path, resume=True)
    assert log.is_done("t", "a")
    assert not (tmp_path / "results.jsonl").exists()


def test_results_file_appears_with_the_first_row(tmp_path):
    log = ResultsLog(tmp_path / "out")
    assert not (tmp_path / "out" / "results.jsonl").exists()
    ResultsLog(tmp_path / "out", resume=True)  # nothing to rewrite: still no file
    assert not (tmp_path / "out" / "results.jsonl").exists()
    log.write([Row("t", "a", "q", 1.0, 1.0, "cpu")])
    assert len(read_rows(tmp_path / "out")) == 1
