"""The app's Serve page: what ``costmodel serve`` computes, the throughput-latency curve and
the memory split; bad input is a message naming the field, never a traceback."""

from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest


def _serve() -> None:
    from explorer.serving import serve_page

    serve_page()


def test_serve_page_estimates_draws_and_refuses():
    at = AppTest.from_function(_serve, default_timeout=300).run()
    assert not at.exception and not at.error
    assert "Fits" in at.success[0].value and not at.warning  # a dense model, calibrated
    assert " GB) per device; up to " in at.success[0].value  # its memory, as the CLI says it
    assert [m.label for m in at.metric][:3] == [
        "KV cache per token",
        "TTFT (the batch's prefill)",
        "TPOT (mean)",
    ]
    assert any(m.value.startswith("**Limited by** decode") for m in at.markdown)
    assert at.metric[0].value == "131,072 B"  # Llama-3-8B, bf16: 2 x 32 x 8 x 128 x 2
    assert len(at.get("vega_lite_chart")) == 2
    at.number_input(key="serve_tp").set_value(3)
    at.button[0].click().run()
    assert not at.exception and "tp must divide n heads" in at.error[0].value


def test_serve_page_prices_drafts_pools_experts_and_continuous_batching():
    at = AppTest.from_function(_serve, default_timeout=300).run()
    at.number_input(key="serve_draft_tokens").set_value(2)
    at.button[0].click().run()
    assert not at.exception and any("Speculative decoding" in c.value for c in at.caption)
    at.number_input(key="serve_draft_tokens").set_value(0)
    at.number_input(key="serve_prefill_replicas").set_value(1)
    at.button[0].click().run()
    assert not at.exception and any("Disaggregated" in c.value for c in at.caption)
    at.number_input(key="serve_prefill_replicas").set_value(0)
    at.selectbox(key="serve_arrival").set_value("continuous")
    at.button[0].click().run()
    assert not at.exception and not at.error
    at.number_input(key="serve_ep").set_value(2)  # Llama-3-8B has no experts
    at.button[0].click().run()
    assert not at.exception and "ep > 1 needs a mixture-of-experts model" in at.error[0].value


def test_serve_page_answers_at_a_request_rate_as_the_cli_does():
    """A rate alone: random arrivals simulated (the CLI's default), percentiles shown; as a
    steady state (continuous) the rate's means, and past capacity refused."""
    at = AppTest.from_function(_serve, default_timeout=300).run()
    at.number_input(key="serve_request_rate").set_value(2.0)
    at.button[0].click().run()
    assert not at.exception and not at.error
    assert "requests simulated" in at.success[0].value
    assert any("TTFT p50" in c.value and "p99" in c.value for c in at.caption)
    at.selectbox(key="serve_arrival").set_value("poisson")  # stated: the same, and its curve
    at.button[0].click().run()
    assert not at.exception and "requests simulated" in at.success[0].value
    at.selectbox(key="serve_arrival").set_value("continuous")
    at.button[0].click().run()
    assert "keep" in at.success[0].value and "in flight" in at.success[0].value
    assert at.metric[3].value == "1,000"  # 2 requests/s x 500 tokens
    at.number_input(key="serve_request_rate").set_value(1e5)
    at.button[0].click().run()
    assert not at.exception and "request rate" in at.error[0].value


def test_serve_page_withholds_times_for_a_batch_that_does_not_fit_and_names_the_nearest():
    """As the CLI: no TTFT, TPOT or throughput beside "does not fit", the nearest change that
    fits, and a mixture-of-experts model's caveat (``costmodel.answers.serve``)."""
    at = AppTest.from_function(_serve, default_timeout=300).run()
    at.selectbox(key="serve_model").set_value("mixtral-8x7b")
    at.number_input(key="serve_batch").set_value(512)
    at.button[0].click().run()
    assert not at.exception
    (error,) = at.error
    assert "Does not fit" in error.value and "Nearest fit: tp " in error.value
    assert [m.label for m in at.metric] == ["KV cache per token"]
    assert not at.get("vega_lite_chart")
    assert any(w.value.startswith("mixture-of-experts serving is less certain") for w in at.warning)


def test_serve_page_shows_the_engine_and_the_workload_and_prices_the_one_chosen():
    """The Assumed line says what the CLI's assumptions say (engine, its host time, the
    workload); another engine is another answer, with its own defaults."""
    at = AppTest.from_function(_serve, default_timeout=300).run()
    said = next(c.value for c in at.caption if c.value.startswith("Assumed:"))
    assert "engine vLLM V1" in said and "the batch's prompts arrive together" in said
    tpot = at.metric[2].value
    at.selectbox(key="serve_engine").set_value("vllm-0.5")
    at.button[0].click().run()
    said = next(c.value for c in at.caption if c.value.startswith("Assumed:"))
    assert not at.exception and "engine vLLM 0.5 (V0)" in said and "whole prompts" in said
    assert at.metric[2].value != tpot
    at.selectbox(key="serve_engine").set_value("trtllm")
    at.selectbox(key="serve_precision").set_value("fp8")
    at.button[0].click().run()
    said = next(c.value for c in at.caption if c.value.startswith("Assumed:"))
    assert "fp8 weights scaled as the model's own fp8 checkpoint" in said
    assert "fp8 cache" in said  # TensorRT-LLM's rule, the cache left on auto
    at.selectbox(key="serve_fp8_scaling").set_value("block")  # the control its words name
    at.button[0].click().run()
    said = next(c.value for c in at.caption if c.value.startswith("Assumed:"))
    assert not at.exception and "fp8 weights with block scales (fp8 scaling)" in said


def test_poisson_without_a_rate_is_refused_and_a_tp_cache_is_a_devices():
    """Two probes: poisson arrivals with rate 0 answered a green "Fits" as continuous
    batching (the CLI refuses --arrival poisson without --request-rate); at tp 4 the KV
    cache per token was a device's without saying so."""
    at = AppTest.from_function(_serve, default_timeout=300).run()
    at.selectbox(key="serve_arrival").set_value("poisson")
    at.button[0].click().run()
    assert not at.exception and not at.success
    assert "arrival **poisson** simulates requests" in at.error[0].value
    at.selectbox(key="serve_arrival").set_value("together")
    at.number_input(key="serve_tp").set_value(4)
    at.button[0].click().run()
    assert not at.exception
    assert at.metric[0].label == "KV cache per token (a device: its share of tp 4)"
    assert at.metric[0].value == "32,768 B"  # 131,072 B over 4 devices


def test_serve_page_says_when_not_one_sequence_fits_as_the_cli_does():
    """Issue 60: Mixtral's weights alone pass one H100, and the page said "up to 0 requests
    at once" where the CLI says not one sequence's cache fits; at a request rate the same
    verdict, with its nearest fit, is shown (the result had disappeared)."""
    at = AppTest.from_function(_serve, default_timeout=300).run()
    at.selectbox(key="serve_model").set_value("mixtral-8x7b")
    at.button[0].click().run()
    (error,) = at.error
    assert not at.exception and "Does not fit" in error.value
    assert "the weights alone do not fit" in error.value  # 93 GB: not the cache's fault
    assert "up to 0" not in error.value and "Nearest fit: precision fp8" in error.value
    at.number_input(key="serve_request_rate").set_value(2.0)
    at.button[0].click().run()
    (error,) = at.error
    assert not at.exception and "the weights alone do not fit" in error.value
    assert [m.label for m in at.metric] == ["KV cache per token"]
    at.selectbox(key="serve_model").set_value("llama3-8b")
    at.number_input(key="serve_dp").set_value(2)
    at.button[0].click().run()  # fits: the count per replica and over the replicas
    assert "sequences fit a replica (" in at.success[0].value
    assert "over the 2 replicas)" in at.success[0].value


def _verdict_row(capsys, *flags: str) -> str:
    from costmodel.cli import main

    argv = ["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--input", "2000",
            "--output", "500", *flags]  # fmt: skip
    assert main(argv) == 0
    return next(x for x in capsys.readouterr().out.splitlines() if "verdict" in x)


def test_serve_page_says_memory_in_the_clis_units(capsys):
    """Issue 60's leftover: the page printed memory in GB ("27.6 GB") where the CLI prints
    "25.72 GiB (27.62 GB)"; both now write it with ``costmodel.units.fmt_bytes``, the memory
    chart's axis in GiB, its tooltip the same text."""
    at = AppTest.from_function(_serve, default_timeout=300).run()
    memory = next(m.value for m in at.metric if m.label == "memory per device")
    assert " GiB (" in memory and memory.endswith(" GB)")
    assert f"fits: {memory} of " in _verdict_row(capsys, "--batch", "32")
    bar = at.get("vega_lite_chart")[1].proto.spec
    assert '"GiB"' in bar and '"GB"' not in bar
    spec = json.loads(bar)  # a fifth probe: with no y channel the bar drew no height
    assert spec["encoding"]["y"]["field"] == "of" and spec["encoding"]["x"]["stack"] == "zero"
    at.number_input(key="serve_batch").set_value(4096)
    at.button[0].click().run()
    (error,) = at.error
    row = _verdict_row(capsys, "--batch", "4096")
    said = row.split("does NOT fit: ", 1)[1].split(" per device", 1)[0]
    assert f"**Does not fit**: {said} per device" in error.value and " GiB (" in said


def test_the_estimate_pages_training_batch_is_not_requests_at_once():
    """Issue 60's fourth probe: the Serve page took the Estimate page's batch (sequences of
    a training step) as its requests at once; it keeps the model and device only."""
    at = AppTest.from_function(_serve, default_timeout=300)
    at.session_state["_estimate_inputs"] = {"model": "llama3-8b", "hardware": "h200",
                                            "batch": 256}  # fmt: skip
    at.run()
    assert not at.exception
    assert at.session_state["serve_batch"] == 32 and at.session_state["serve_model"] == "llama3-8b"


def test_a_context_past_the_positions_can_be_scaled_on_the_page():
    """Issue 60's fifth probe: a context past Llama-3-405B's 8,192 positions was refused
    naming RoPE scaling, which the page had no input for."""
    at = AppTest.from_function(_serve, default_timeout=300).run()
    at.selectbox(key="serve_model").set_value("llama3-8b")
    at.number_input(key="serve_input").set_value(8000)
    at.number_input(key="serve_output").set_value(1000)
    at.button[0].click().run()
    assert not at.exception and "RoPE scaling" in at.error[0].value
    at.number_input(key="serve_rope_scaling").set_value(2.0)
    at.button[0].click().run()
    assert not at.exception and not at.error


def test_the_serve_page_says_its_default_engine_and_keeps_its_own_precision():
    """Issue 60's seventh probe: the page's assumptions named vLLM V1 without "default",
    as the CLI says it, and an Estimate page training in fp8 set the served weights to fp8
    unsaid (training fp8 is no fp8 checkpoint)."""
    at = AppTest.from_function(_serve, default_timeout=300)
    at.session_state["_estimate_inputs"] = {"model": "llama3-8b", "precision": "fp8"}
    at.run()
    assert not at.exception and at.session_state["serve_precision"] == "bf16"
    assumed = [c.value for c in at.caption if c.value.startswith("Assumed:")]
    assert assumed and "(default; engine)" in assumed[0]
