"""The app's Serve page: what ``costmodel serve`` computes, the throughput-latency curve and
the memory split; bad input is a message naming the field, never a traceback."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _serve() -> None:
    from explorer.serving import serve_page

    serve_page()


def test_serve_page_estimates_draws_and_refuses():
    at = AppTest.from_function(_serve, default_timeout=300).run()
    assert not at.exception and not at.error
    assert "fits" in at.markdown[0].value
    assert [m.label for m in at.metric][:3] == ["KV cache per token", "TTFT", "TPOT"]
    assert at.metric[0].value == "131,072 B"  # Llama-3-8B, bf16: 2 x 32 x 8 x 128 x 2
    assert len(at.get("vega_lite_chart")) == 2
    at.number_input(key="serve_tp").set_value(3)
    at.button[0].click().run()
    assert not at.exception and "tp must divide n_heads" in at.error[0].value
