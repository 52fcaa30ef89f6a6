"""validate.run: JSONL rows, resume, OOM and error handling, interrupts, report, smoke run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from costmodel.catalog.hardware import get_hardware
from validate import run as run_module
from validate.report.render import markdown, summary, targets, write_report
from validate.report.results import ResultsLog, Row, read_rows, rel_err
from validate.suites.runner import Case, Context, run_cases

CTX = Context(torch.device("cpu"), "cpu", get_hardware("cpu"))
ROOT = Path(__file__).parent.parent


def _row(case: str, quantity: str = "q", predicted=1.0, measured=1.0, suite="t") -> Row:
    return Row(suite, case, quantity, predicted, measured, "cpu", "ok", "s")


def _case(name: str, body) -> Case:
    return Case("t", name, body)


def _code(out) -> int:
    """The exit status of a run without errors: 3 when its rows miss a target, else 0."""
    return 3 if any(t["met"] is False for t in targets(read_rows(out))) else 0


def test_rel_err_signs_and_missing_values():
    assert rel_err(110, 100) == pytest.approx(0.1)
    assert rel_err(90, 100) == pytest.approx(-0.1)
    assert rel_err(0, 0) == 0.0
    assert rel_err(None, 5) is None
    assert rel_err(5, 0) is None


def test_rows_keep_exact_integers_and_required_fields(tmp_path):
    log = ResultsLog(tmp_path)
    big = 3_342_137_391_316_992
    log.write([_row("a", predicted=big, measured=big)])
    (row,) = read_rows(tmp_path)
    assert row["predicted"] == big and isinstance(row["predicted"], int)
    for key in ("suite", "case", "quantity", "predicted", "measured", "rel_err", "device"):
        assert key in row
    assert row["status"] == "ok" and row["rel_err"] == 0.0


def test_existing_results_need_resume(tmp_path):
    ResultsLog(tmp_path).write([_row("a")])
    with pytest.raises(FileExistsError, match="--resume"):
        ResultsLog(tmp_path)


def test_resume_drops_partial_case_and_skips_finished(tmp_path):
    log = ResultsLog(tmp_path)
    log.write([_row("done")])
    log.finish("t", "done", "ok", 0.1)
    log.write([_row("partial")])  # interrupted before finish
    with (tmp_path / "results.jsonl").open("a") as fh:
        fh.write('{"torn": ')  # killed mid-write
    resumed = ResultsLog(tmp_path, resume=True)
    assert resumed.is_done("t", "done") and not resumed.is_done("t", "partial")
    assert [r["case"] for r in read_rows(tmp_path)] == ["done"]


def test_oom_and_errors_become_rows_and_the_run_goes_on(tmp_path):
    def oom(ctx):
        yield _row("oom", "first")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def broken(ctx):
        raise ValueError("bad shape")
        yield

    def fine(ctx):
        yield _row("fine")

    log = ResultsLog(tmp_path)
    cases = [_case("oom", oom), _case("broken", broken), _case("fine", fine)]
    statuses = run_cases(cases, CTX, log)
    assert statuses == {"oom": 1, "error": 1, "ok": 1}
    rows = read_rows(tmp_path)
    by_case = {(r["case"], r["status"]) for r in rows}
    assert ("oom", "ok") in by_case, "rows measured before the OOM are kept"
    assert {("oom", "oom"), ("broken", "error"), ("fine", "ok")} <= by_case
    error = next(r for r in rows if r["status"] == "error")
    assert "ValueError: bad shape" in error["message"]


def test_interrupt_keeps_rows_and_resume_runs_only_the_rest(tmp_path):
    ran = []

    def first(ctx):
        ran.append("first")
        yield _row("first")

    def interrupted(ctx):
        ran.append("interrupted")
        yield _row("interrupted", "partial")
        raise KeyboardInterrupt

    cases = [_case("first", first), _case("interrupted", interrupted)]
    with pytest.raises(KeyboardInterrupt):
        run_cases(cases, CTX, ResultsLog(tmp_path))
    assert {r["case"] for r in read_rows(tmp_path)} == {"first", "interrupted"}
    cases[1] = _case("interrupted", lambda ctx: iter([_row("interrupted", "complete")]))
    run_cases(cases, CTX, ResultsLog(tmp_path, resume=True))
    assert ran == ["first", "interrupted"], "the finished case is not run again"
    quantities = [(r["case"], r["quantity"]) for r in read_rows(tmp_path)]
    assert quantities == [("first", "q"), ("interrupted", "complete")]


def test_report_summary_and_targets():
    rows = [
        _row("a", "time_s.forward", 1.1, 1.0, suite="model").to_dict(),
        _row("b", "time_s.forward", 0.7, 1.0, suite="model").to_dict(),
        _row("c", "time_s.forward", 1.05, 1.0, suite="model").to_dict(),
        _row("a", "params.total", 7, 7, suite="accounting").to_dict(),
        Row("model", "d", "oom", None, None, "cpu", "oom", extra={"message": "OOM"}).to_dict(),
    ]
    (line,) = [s for s in summary(rows) if s["quantity"] == "time_s.forward"]
    assert line["n"] == 3
    assert line["median_abs_rel_err"] == pytest.approx(0.1)
    assert line["max_abs_rel_err"] == pytest.approx(0.3)
    met = {t["target"].split(":")[0]: t for t in targets(rows)}
    assert met["exact counts"]["met"] is True
    assert met["forward/backward/step time"]["value"] == pytest.approx(0.1)
    assert met["peak memory"]["met"] is None
    text = markdown(rows)
    assert "| model | d | oom | OOM |" in text
    assert "10.00 %" in text


def test_report_files_have_charts(tmp_path):
    log = ResultsLog(tmp_path)
    log.write([_row("a", "time_s.forward", 1.1, 1.0, suite="model")])
    log.write([_row("a", "op_time_s.forward.ffn", 0.5, 0.4, suite="model")])
    md, page = write_report(tmp_path)
    assert "time_s.forward" in md.read_text()
    text = page.read_text()
    assert text.count("<svg") == 3  # scatter, errors, breakdown
    assert "Time per component" in text and "<script" not in text


def test_smoke_quick_run_cpu(tmp_path, capsys):
    """One real model case and one accounting case through the CLI, then a resume."""
    out = tmp_path / "out"
    args = ["--quick", "--device", "cpu", "--hardware", "cpu", "--out", str(out)]
    model_case = "gpt2@L2/b1/t256/fp32/flash/eager/adamw-foreach"
    # one CPU case can miss the time target: the code must say so (3), not error (1)
    assert run_module.main([*args, "--suite", "model", "--filter", model_case]) == _code(out)
    rows = read_rows(out)
    quantities = {r["quantity"] for r in rows}
    assert {"time_s.forward", "time_s.backward", "time_s.optimizer", "time_s.step"} <= quantities
    assert {"memory_bytes.peak", "mfu", "tflops_per_device"} <= quantities
    for r in rows:
        assert r["status"] == "ok" and r["measured"] > 0 and r["predicted"] > 0
        assert r["config"]["preset"] == "gpt2"
    peak = next(r for r in rows if r["quantity"] == "memory_bytes.peak")
    assert abs(peak["rel_err"]) < 0.10
    resumed = run_module.main([*args, "--suite", "model", "--filter", model_case, "--resume"])
    assert resumed == _code(out)
    assert "1 of 1 cases already done" in capsys.readouterr().out
    assert len(read_rows(out)) == len(rows)
    acc = ["--suite", "accounting", "--filter", "gpt2/b2/t1024/bf16-mixed/flash", "--resume"]
    assert run_module.main([*args, *acc]) == _code(out)
    exact = [r for r in read_rows(out) if r["suite"] == "accounting"]
    assert exact and all(r["predicted"] == r["measured"] for r in exact)
    assert json.loads((out / "cases.jsonl").read_text().splitlines()[-1])["status"] == "ok"
    assert (out / "report.html").exists()


@pytest.mark.gpu
def test_smoke_cuda_model_case_and_profile(tmp_path):
    """CUDA events, max_memory_allocated and the profiled breakdown on a real GPU."""
    out = tmp_path / "out"
    args = ["--quick", "--device", "cuda", "--suite", "model", "--out", str(out)]
    assert run_module.main([*args, "--filter", "gpt2/b8/t1024/bf16-mixed/flash/eager"]) == _code(
        out
    )
    rows = read_rows(out)
    assert {r["status"] for r in rows} == {"ok"}
    peak = next(r for r in rows if r["quantity"] == "memory_bytes.peak")
    assert abs(peak["rel_err"]) < 0.10
    assert any(r["quantity"].startswith("op_time_s.") for r in rows)


def test_smoke_attention_suite_cpu(tmp_path):
    out = tmp_path / "out"
    args = ["--quick", "--device", "cpu", "--hardware", "cpu", "--out", str(out)]
    args += ["--suite", "attention"]
    assert run_module.main([*args, "--filter", "correctness"]) == 0
    assert run_module.main([*args, "--filter", "naive/fp32/seq256/d16", "--resume"]) == 0
    rows = read_rows(out)
    errors = [r for r in rows if r["quantity"].startswith("max_abs_error")]
    assert len(errors) == 8 and all(r["measured"] < r["tolerance"] for r in errors)
    memory = [r for r in rows if r["quantity"].startswith("memory_bytes")]
    assert len(memory) == 2 and all(r["rel_err"] == 0 for r in memory)  # naive: exact
    assert "Attention kernels" in (out / "report.md").read_text()


def test_rows_must_belong_to_their_case(tmp_path):
    """Resume is keyed by case: a row naming another case is an error row, not lost later."""
    log = ResultsLog(tmp_path)
    statuses = run_cases([_case("mine", lambda ctx: iter([_row("other")]))], CTX, log)
    assert statuses == {"error": 1}
    (row,) = read_rows(tmp_path)
    assert row["case"] == "mine" and "row of t/other from case t/mine" in row["message"]


def _suite(monkeypatch, *rows: Row) -> None:
    """The accounting suite replaced by one case yielding ``rows`` (exact-count target)."""

    def body(ctx):
        yield from rows

    case = Case("accounting", "x", body)
    monkeypatch.setitem(run_module.SUITES, "accounting", lambda ctx: [case])


def test_missed_target_exits_3_and_names_it_last(tmp_path, monkeypatch, capsys):
    args = ["--device", "cpu", "--hardware", "cpu", "--suite", "accounting"]
    _suite(monkeypatch, _row("x", "params.total", 7, 7, suite="accounting"))
    assert run_module.main([*args, "--out", str(tmp_path / "met")]) == 0
    assert "MISSED" not in capsys.readouterr().out
    _suite(monkeypatch, _row("x", "params.total", 8, 7, suite="accounting"))
    assert run_module.main([*args, "--out", str(tmp_path / "missed")]) == 3
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "MISSED 1 of 8 targets: exact counts: zero error (value 14.29 %, bound 0.00 %)"


def test_an_error_keeps_exit_1_even_with_a_missed_target(tmp_path, monkeypatch, capsys):
    def body(ctx):
        yield _row("x", "params.total", 8, 7, suite="accounting")
        raise ValueError("broken")

    monkeypatch.setitem(
        run_module.SUITES, "accounting", lambda ctx: [Case("accounting", "x", body)]
    )
    args = ["--device", "cpu", "--hardware", "cpu", "--suite", "accounting", "--out", str(tmp_path)]
    assert run_module.main(args) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("MISSED 1 of 8 targets")


def test_bad_hardware_is_one_line_and_leaves_nothing_that_blocks(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        run_module.main(["--device", "cpu", "--hardware", "nope", "--out", str(out)])
    message = str(exc.value.code)
    assert message.startswith("--hardware nope: ") and "\n" not in message
    assert not (out / "results.jsonl").exists() and not (out / "cases.jsonl").exists()
    _suite(monkeypatch, _row("x", "params.total", 7, 7, suite="accounting"))
    args = ["--device", "cpu", "--hardware", "cpu", "--suite", "accounting", "--out", str(out)]
    assert run_module.main(args) == 0  # the next run is not told to --resume


def test_bad_hardware_from_the_command_line_prints_no_traceback(tmp_path):
    cmd = [sys.executable, "-m", "validate.run", "--device", "cpu", "--hardware", "nope"]
    done = subprocess.run(
        [*cmd, "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 1
    assert done.stderr.strip().startswith("--hardware nope: ") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("where", ["/proc/x/out", "file", "file/out", "readonly/out"])
def test_unwritable_out_is_one_line(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    (tmp_path / "readonly").mkdir(mode=0o555)
    if where.startswith("readonly") and os.access(tmp_path / "readonly", os.W_OK):
        pytest.skip("root writes into read-only folders")
    with pytest.raises(SystemExit) as exc:
        run_module.main(["--device", "cpu", "--hardware", "cpu", "--out", where])
    message = str(exc.value.code)
    assert message.startswith(f"--out {where}: cannot write there (") and "\n" not in message


def test_existing_results_are_refused_before_calibrating(tmp_path, monkeypatch):
    (tmp_path / "results.jsonl").write_text("")

    def calibrate(*args):
        raise AssertionError("calibrated before checking --out")

    monkeypatch.setattr(run_module, "profile", calibrate)
    with pytest.raises(SystemExit, match="--resume"):
        run_module.main(["--device", "cpu", "--out", str(tmp_path)])
