"""The app's Offload and Padding pages: they show what the planner and the padding model
compute, and bad input is a message, never a traceback."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _offload() -> None:
    from explorer.workloads import offload_page

    offload_page()


def _padding() -> None:
    from explorer.workloads import padding_page

    padding_page()


def test_offload_page_plans_explains_and_refuses():
    at = AppTest.from_function(_offload, default_timeout=300).run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert len(table) == 10 and (table["step (s)"].diff().dropna() >= 0).all()
    assert (table["rounds"] * table["seqs_per_round"] == 68).all()
    assert "compute-bound" in at.markdown[0].value
    assert len(at.get("vega_lite_chart")) == 2
    at.number_input[2].set_value(2.0)  # device budget: 2 GB
    at.button[0].click().run()
    assert not at.exception
    assert "device_budget must be >=" in at.error[0].value


def test_padding_page_compares_and_refuses():
    at = AppTest.from_function(_padding, default_timeout=300).run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert table["strategy"].iloc[0] == "pad-to-max"
    assert table["pad tokens (%)"].iloc[0] > 70 > table["pad tokens (%)"].iloc[-1]
    assert len(at.get("vega_lite_chart")) == 2
    at.text_input[0].set_value("lognormal:median=700")
    at.button[0].click().run()
    assert not at.exception and "needs sigma" in at.error[0].value
