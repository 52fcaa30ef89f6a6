"""The Validation results page reads only folders under the working directory, and skips
(and counts) rows it cannot use instead of crashing (``explorer.results``)."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from explorer.results import folder_under
from validate.report.results import Row


def _page(folder: str) -> AppTest:
    return AppTest.from_function(_results_page, args=(folder,), default_timeout=60).run()


def _results_page(folder: str) -> None:
    import streamlit as st

    from explorer.results import results_page

    st.session_state.setdefault("results_dir", folder)
    results_page()


def test_folder_under_refuses_escapes_and_outside_symlinks(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "res").mkdir(parents=True)
    outside.mkdir()
    (root / "out_link").symlink_to(outside)
    (root / "in_link").symlink_to(root / "res")
    assert folder_under("res", root) == (root / "res").resolve()
    assert folder_under("", root) == root.resolve()
    assert folder_under("in_link", root) == (root / "res").resolve()
    assert folder_under("res/../res", root) == (root / "res").resolve()
    for bad in ("..", "../outside", "res/../../outside", str(outside), "/etc", "out_link", "a\0b"):
        assert folder_under(bad, root) is None, bad


def test_page_refuses_a_folder_outside_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "outside").mkdir()
    row = Row("model", "c", "time_s.forward", 1.1, 1.0, "cpu", "ok", "s").to_dict()
    (tmp_path / "outside" / "results.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    for folder in ("../outside", str(tmp_path / "outside")):
        at = _page(folder)
        assert not at.exception
        assert "Only folders under the working directory" in at.error[0].value
        assert not at.metric
    assert "working directory" in at.text_input[0].help


def test_page_skips_rows_without_required_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    good = Row("model", "c", "time_s.forward", 1.1, 1.0, "cpu", "ok", "s").to_dict()
    no_status = {k: v for k, v in good.items() if k != "status"}
    lines = [json.dumps(good), json.dumps(no_status), '{"suite": "model", "ca', "[1, 2]"]
    Path("out/results.jsonl").write_text("\n".join(lines) + "\n")
    at = _page("out")
    assert not at.exception
    assert at.metric[0].value == "1"
    assert at.warning[0].value == "3 lines skipped (unreadable or missing fields)"


def test_page_refuses_a_results_file_linked_from_outside_or_not_regular(tmp_path, monkeypatch):
    """Issue 38: a results.jsonl that is a symlink to a file outside the working directory
    is refused by name, and so is a FIFO (it would block the read); a link inside is read."""
    import os

    row = Row("model", "c", "time_s.forward", 1.1, 1.0, "cpu", "ok", "s").to_dict()
    (tmp_path / "secret.jsonl").write_text(json.dumps(row) + "\n")
    cwd = tmp_path / "cwd"
    for name in ("linked", "fifo", "inside"):
        (cwd / name).mkdir(parents=True)
    (cwd / "linked" / "results.jsonl").symlink_to(tmp_path / "secret.jsonl")
    os.mkfifo(cwd / "fifo" / "results.jsonl")
    (cwd / "real.jsonl").write_text(json.dumps(row) + "\n")
    (cwd / "inside" / "results.jsonl").symlink_to(cwd / "real.jsonl")
    monkeypatch.chdir(cwd)
    for folder, why in (("linked", "outside the working directory"), ("fifo", "not a regular")):
        at = _page(folder)
        assert not at.exception and why in at.error[0].value and not at.metric
    at = _page("inside")
    assert not at.exception and not at.error and at.metric


def test_results_page_plots_a_results_folder(tmp_path, monkeypatch):
    from validate.report.results import ResultsLog, Row

    monkeypatch.chdir(tmp_path)  # the page reads folders under the working directory only
    log = ResultsLog(tmp_path / "out")
    log.write([Row("model", "c", "time_s.forward", 1.1, 1.0, "cpu", "ok", "s")])
    at = _page("out")
    assert not at.exception
    assert at.metric[0].value == "1"
    assert len(at.get("vega_lite_chart")) == 1


def test_a_results_folder_name_too_long_is_a_message(tmp_path, monkeypatch):
    """A probe: a 300-character folder name raised OSError (File name too long)."""
    monkeypatch.chdir(tmp_path)
    at = _page("x" * 300)
    assert not at.exception and "cannot be read: File name too long" in at.error[0].value
