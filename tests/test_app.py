"""The Streamlit page renders, reacts to widgets and reports bad input as a message."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).parent.parent / "app.py")


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_renders_default_preset():
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert metric(at, "parameters") == "3.41 B"


def test_longer_sequence_needs_more_activation_memory():
    at = AppTest.from_file(APP, default_timeout=60).run()
    before = float(metric(at, "activations (GiB)"))
    at.number_input[1].set_value(4096).run()
    assert float(metric(at, "activations (GiB)")) > before


def test_bad_input_is_a_message_not_a_traceback():
    at = AppTest.from_file(APP, default_timeout=60).run()
    at.number_input[0].set_value(6).run()
    at.number_input[2].set_value(4).run()  # grad_accum must divide batch
    assert not at.exception
    assert "grad_accum must divide batch" in at.error[0].value
