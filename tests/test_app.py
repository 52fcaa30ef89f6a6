"""The Streamlit explorer: pages render, widgets change outputs, bad input is a message,
the URL carries the state (``streamlit.testing.v1.AppTest``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from explorer.state import START, from_query, setup_of, to_query

APP = str(Path(__file__).parent.parent / "app.py")


def _app(**query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_renders_default_setup_with_every_section():
    at = _app()
    assert not at.exception
    assert metric(at, "parameters") == "3.41 B"
    assert "Fits" in at.success[0].value and "on 1 × h100-sxm" in at.success[0].value
    labels = {m.label for m in at.metric}
    for label in (
        "memory per device (GiB)",
        "step time (s)",
        "tokens/s",
        "MFU",
        "days to train",
        "min FSDP degree (full model)",
        "min FSDP degree (book)",
        "compute-bound from batch (full model)",
    ):
        assert label in labels
    assert [b.label for b in at.get("download_button")] == ["estimate.json", "estimate.csv"]
    assert len(at.tabs) == 6
    assert len(at.get("vega_lite_chart")) == 5  # memory x2, comm, FLOPs, roofline
    assert len(at.latex) >= 5
    assert [c for c in at.caption if c.value.startswith("computed in")]


def test_widgets_change_outputs_and_the_url():
    at = _app()
    before = float(metric(at, "memory per device (GiB)"))
    at.number_input(key="seq").set_value(4096).run()
    assert float(metric(at, "memory per device (GiB)")) > before
    assert at.query_params["seq"] in ("4096", ["4096"])
    step = float(metric(at, "step time (s)"))
    at.selectbox(key="hardware").set_value("a100-80gb").run()
    assert float(metric(at, "step time (s)")) > step  # slower device, same work
    at.number_input(key="token_budget").set_value(1e9).run()
    assert metric(at, "days to train") != "–"


def test_url_reproduces_the_view():
    at = _app(model="gpt2", batch="64", seq="512", fsdp="4", zero="2", gpus="8")
    assert not at.exception
    assert at.selectbox(key="model").value == "gpt2"
    assert at.number_input(key="batch").value == 64
    assert metric(at, "parameters") == "124.44 M"
    shared = dict(at.query_params)
    again = _app(**{k: v[0] if isinstance(v, list) else v for k, v in shared.items()})
    assert metric(again, "memory per device (GiB)") == metric(at, "memory per device (GiB)")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"grad_accum": 3}, "grad_accum must divide batch"),
        ({"gpus": 8, "tp": 3}, "must divide gpus"),
        ({"n_heads": 7}, "n_heads"),
    ],
)
def test_bad_input_is_a_message_next_to_the_widget(changes, message):
    at = _app()
    for key, value in changes.items():
        at.number_input(key=key).set_value(value).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(message in e for e in errors), errors
    assert any(message in e.value for e in at.sidebar.error), "shown in the sidebar section"


def test_bad_url_parameters_are_warnings_not_tracebacks():
    at = _app(batch="lots", precision="fp64", evil="__import__('os')")
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "batch='lots'" in warnings and "precision='fp64'" in warnings and "'evil'" in warnings
    assert metric(at, "parameters") == "3.41 B"  # defaults used


def test_does_not_fit_is_said_plainly():
    at = _app(model="llama3-70b")
    assert not at.exception
    assert "Does not fit" in at.error[0].value


def test_state_round_trip_and_build_errors():
    values, problems = from_query({"batch": "8", "sequence_parallel": "1", "zero": "4"})
    assert values["batch"] == 8 and values["sequence_parallel"] is True
    assert problems and "zero" in problems[0]
    assert from_query(to_query(values))[0] == values
    setup, errors = setup_of({**START, "gpus": 16, "batch": 32, "fsdp": 8})
    assert errors == {} and setup.parallel.dp == 2 and setup.parallel.devices == 16
    _, errors = setup_of({**START, "seq": 0})
    assert "seq must be >= 1" in errors["training"]
    _, errors = setup_of({**START, "gpus": 8, "tp": 16})
    assert "tp" in errors["cluster"]
    _, errors = setup_of({**START, "n_heads": 7})
    assert "n_heads must divide d_model" in errors["model"]


def test_results_page_plots_a_results_folder(tmp_path, monkeypatch):
    from validate.report.results import ResultsLog, Row

    monkeypatch.chdir(tmp_path)  # the page reads folders under the working directory only
    log = ResultsLog(tmp_path / "out")
    log.write([Row("model", "c", "time_s.forward", 1.1, 1.0, "cpu", "ok", "s")])
    at = AppTest.from_function(_results_page, args=("out",), default_timeout=60).run()
    assert not at.exception
    assert at.metric[0].value == "1"
    assert len(at.get("vega_lite_chart")) == 1


def _results_page(folder: str) -> None:
    import streamlit as st

    from explorer.results import results_page

    st.session_state.setdefault("results_dir", folder)
    results_page()
