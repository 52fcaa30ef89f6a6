"""The Streamlit explorer: pages render, widgets change outputs, bad input is a message,
the URL carries the state (``streamlit.testing.v1.AppTest``)."""

from __future__ import annotations

import math
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
    setup, _ = setup_of(START, None)  # the verdict is the one fit rule's (engine.fit)
    fit = setup.estimate().fit()
    amber = fit.fits and (fit.tight or fit.reserve_warning() is not None)
    shown = (at.warning if amber else at.success if fit.fits else at.error)[0].value
    assert shown.startswith("Fits" if fit.fits else "Does not fit") and "on 1 × h100-sxm" in shown
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
    # the book's min FSDP in its named terms (the expanded sympy form overflowed its column)
    shown = [x.value.strip("$\n") for x in at.latex]
    assert r"N_{FSDP} \ge \frac{S + f\,A}{M - (1 - f)\,A}" in shown
    (terms,) = [c.value for c in at.caption if c.value.startswith("S = ")]
    exact = float(terms.rsplit("N >= ", 1)[1].replace(",", ""))
    assert math.ceil(exact - 1e-9) == int(metric(at, "min FSDP degree (book)"))
    at.toggle(key="show_formulas").set_value(True).run()  # the formulas, on request
    assert len(at.latex) >= 5
    assert [c for c in at.caption if c.value.startswith("computed in")]
    assert [c for c in at.caption if c.value.startswith("Calibration: ")]  # the CLI's line


def test_widgets_change_outputs_and_the_url():
    at = _app(gpus="2", fsdp="2")  # sharded: fits on either device (the rule's 0.9 headroom)
    before = float(metric(at, "memory per device (GiB)"))
    at.number_input(key="seq").set_value(4096).run()
    assert float(metric(at, "memory per device (GiB)")) > before
    assert at.query_params["seq"] in ("4096", ["4096"])
    step = float(metric(at, "step time (s)"))
    at.selectbox(key="hardware").set_value("a100-80gb").run()
    assert float(metric(at, "step time (s)")) > step  # slower device, same work
    at.number_input(key="seq").set_value(1024).run()
    at.number_input(key="token_budget").set_value(1e9).run()
    assert "Fits" in at.success[0].value and metric(at, "days to train") != "–"


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


def test_an_attention_kernel_the_device_lacks_is_a_message_not_a_traceback():
    at = _app()
    at.selectbox(key="hardware").set_value("a100-80gb").run()
    at.selectbox(key="attention_kernel").set_value("fa3").run()
    assert not at.exception
    said = "hardware a100-80gb has no efficiency for attention_kernel 'fa3' (has: fa2, triton-2022)"
    assert any(said in e.value for e in at.sidebar.error)


def test_the_fp8_recipe_shows_under_fp8_and_a_device_without_mx_says_so():
    at = _app()
    assert not any(w.key == "fp8_recipe" for w in at.selectbox)  # bf16-mixed: not asked
    at.selectbox(key="precision").set_value("fp8").run()
    at.selectbox(key="fp8_recipe").set_value("mxfp8").run()
    assert not at.exception
    said = "fp8_recipe mxfp8 needs matrix cores that apply MX block scales"
    assert any(said in e.value for e in at.sidebar.error)
    at.selectbox(key="hardware").set_value("b200").run()
    assert not at.exception and not at.sidebar.error


def test_bad_url_parameters_are_warnings_not_tracebacks():
    at = _app(batch="lots", precision="fp64", evil="__import__('os')")
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "batch='lots'" in warnings and "precision='fp64'" in warnings and "'evil'" in warnings
    assert metric(at, "parameters") == "3.41 B"  # defaults used


def test_does_not_fit_is_said_plainly():
    at = _app(model="llama3-70b", token_budget="1e12", price_per_hour="2")
    assert not at.exception
    assert "Does not fit" in at.error[0].value
    assert metric(at, "MFU") == "–" and metric(at, "days to train") == "–"  # no cost to run


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"seq": "0"}, "seq='0' must be between 1 and 2^53"),
        ({"fsdp": "-2"}, "fsdp='-2' must be a whole number >= 1"),
        ({"n_kv_heads": "0"}, "n_kv_heads='0' must be between 1 and 2^53"),
        ({"batch": "1e3"}, "batch='1e3' must be a whole number >= 1"),
        ({"token_budget": "-5"}, "token_budget='-5' must be a finite number >= 0"),
        ({"gpus": str(10**400)}, "must be between 1 and 2^53"),
    ],
)
def test_url_values_the_widgets_cannot_hold_are_named_not_clamped(query, says):
    """Each in words (no Python internals), in one box with the others, the start used."""
    at = _app(**query, precision="fp64")
    assert not at.exception
    said = [w.value for w in at.warning if "precision='fp64'" in w.value]  # one box for all
    assert len(said) == 1  # (the default view also warns that its reserve is over budget)
    text = said[0]
    assert says in text
    assert "literal" not in text and "int()" not in text
    assert metric(at, "parameters") == "3.41 B"


def test_a_url_warning_goes_once_its_input_is_changed():
    at = _app(seq="0", batch="lots")
    at.number_input(key="seq").set_value(512).run()
    text = " ".join(w.value for w in at.warning)
    assert "seq=" not in text and "batch='lots'" in text


def test_bad_input_keeps_the_last_result_greyed_and_offers_the_nearest_value():
    at = _app(gpus="2", fsdp="2")
    peak = metric(at, "memory per device (GiB)")
    at.number_input(key="grad_accum").set_value(3).run()
    assert not at.exception
    assert any("grad_accum must divide batch" in e.value for e in at.error)
    assert metric(at, "memory per device (GiB)") == peak  # the last valid result, greyed
    assert not at.success and "Last valid inputs" in at.info[0].value
    assert any(".st-key-stale" in h.proto.body for h in at.get("html"))
    button = next(b for b in at.button if "Use gradient accumulation steps = 2" in b.label)
    button.click().run()
    assert not at.error and at.number_input(key="grad_accum").value == 2
    assert "Fits" in at.success[0].value


def test_a_refused_upload_is_bad_input_not_the_presets_result():
    refused = "config.json: vocab_size must be a positive integer"
    setup, errors = setup_of(START, refused)
    assert setup is None and errors == {"model": refused}


def test_tables_speak_units_and_formulas_come_with_a_legend():
    at = _app()
    memory = at.dataframe[0].value
    sized = [v for k, v in zip(memory[""], memory["value"], strict=True) if k != "peak falls at"]
    assert all(v.endswith(("B", "B)")) for v in sized)
    assert any("GiB (" in v for v in memory["value"])
    assert not any("meaning" in d.value.columns for d in at.dataframe)  # built on request
    at.toggle(key="show_formulas").set_value(True).run()
    frames = [d.value for d in at.dataframe]
    legend = next(f for f in frames if "meaning" in f.columns)
    row = legend[legend["symbol"] == "D"].iloc[0]
    assert row["meaning"] == "model width (d_model)" and row["value"] == "2,560"


def test_state_round_trip_and_build_errors():
    values, problems = from_query({"batch": "8", "sequence_parallel": "1", "zero": "4"})
    assert values["batch"] == 8 and values["sequence_parallel"] is True
    assert list(problems) == ["zero"] and "must be one of 1, 2, 3" in problems["zero"]
    assert from_query(to_query(values))[0] == values
    setup, errors = setup_of({**START, "gpus": 16, "batch": 32, "fsdp": 8})
    assert errors == {} and setup.parallel.dp == 2 and setup.parallel.devices == 16
    _, errors = setup_of({**START, "seq": 0})  # keyed by the widget it is shown under
    assert "seq must be >= 1" in errors["seq"]
    _, errors = setup_of({**START, "gpus": 8, "tp": 16})
    assert "must divide gpus" in errors["tp"]  # under the one degree given
    _, errors = setup_of({**START, "n_heads": 7})
    assert "n_heads must divide d_model" in errors["n_heads"]


def test_memory_charts_span_the_current_setting_and_reach_the_peak():
    from explorer import charts

    assert charts.around(1024, 1) == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert charts.around(24, 8) == [24, 48, 96, 192]  # multiples of the layout's step only
    setup, _ = setup_of({**START, "gpus": 8, "fsdp": 8, "batch": 64})
    rows = charts.memory_rows(setup, "batch", charts.around(64, 8))
    for batch in {r["batch"] for r in rows}:
        gib = {r["component"]: r["GiB"] for r in rows if r["batch"] == batch}
        stack = sum(x for c, x in gib.items() if c != "peak")
        assert gib["transient"] >= 0
        assert stack == pytest.approx(max(gib["peak"], stack - gib["transient"]), rel=1e-12)
    spec = charts.memory_chart(setup, "batch", charts.around(64, 8)).to_dict()
    assert "batch (current: 64)" in str(spec)
    lines = [layer["data"]["values"][0]["GiB"] for layer in spec["layer"][-2:]]
    assert lines == pytest.approx([80.0, 72.0])  # a probe: only the capacity was drawn


def test_flops_axis_in_a_readable_unit():
    from explorer import charts

    v = {"flops.forward_by_op.ffn": 2.5e15, "flops.backward_by_op.ffn": 5e15}
    spec = charts.flops_chart(v).to_dict()
    assert "PFLOP per step" in str(spec)
    assert {r["PFLOP"] for r in spec["data"]["values"]} == {2.5, 5.0}


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("memory_bytes_per_device.peak", 3.3e10, "30.73 GiB (33.00 GB)"),
        ("time_s.step", 0.0123, "12.3 ms"),
        ("comm_phase_s.fsdp.forward", 2.1e-5, "21 µs"),
        ("roofline.ffn.time_s", 2e-3, "2 ms"),
        ("flops.step", 3.2e15, "3,200,000,000,000,000 (3.20 PFLOP)"),
        ("params.total", 3406809600, "3,406,809,600 (3.41 B)"),
        ("mfu", 0.42, "42.0 %"),
        ("tokens_per_s", 78650.4, "78,650"),
        ("train_cost", 12345.6, "$12,346"),
    ],
)
def test_quantities_in_their_units(key, value, text):
    from costmodel.units import fmt_quantity

    assert fmt_quantity(key, value) == text


def test_model_parallel_degrees_need_no_other_change():
    """The defaults are no trap: on 8 GPUs, tp/pp/cp alone are valid and dp fills the rest."""
    at = _app(gpus="8")
    for key, value in (("tp", 2), ("pp", 2), ("cp", 2)):
        at.number_input(key=key).set_value(value).run()
        assert not at.error and "on 8 × h100-sxm" in at.success[0].value, key
    assert "(dp=1)" in at.success[0].value  # 2 x 2 x 2 = 8


def test_a_mixture_of_experts_preset_renders_and_says_what_is_not_modelled():
    """Mixtral: its parameter count, its sections, the book panel's reason instead of
    numbers (its closed forms are for dense stacks), and a tensor-parallel layout refused
    next to the widget, never a traceback."""
    at = _app(model="mixtral-8x7b", gpus="8", fsdp="8", batch="8", seq="4096")
    assert not at.exception
    assert metric(at, "parameters") == "46.70 B"
    assert any("dense FFN stacks" in i.value for i in at.info)
    at = _app(model="mixtral-8x7b", gpus="8", tp="8", batch="8")
    assert not at.exception
    assert any("mixture-of-experts model is modelled under framework=fsdp2 or megatron" in e.value
               for e in at.error)  # fmt: skip


def test_expert_parallelism_is_an_input_and_refused_for_a_dense_model():
    at = _app(model="mixtral-8x7b", gpus="16", fsdp="16", ep="8", batch="16", seq="4096",
              recompute="full")  # fmt: skip
    assert not at.exception and not at.error
    assert at.number_input(key="ep").value == 8
    assert "Fits" in at.success[0].value and "on 16 × h100-sxm" in at.success[0].value
    at = _app(model="mixtral-8x7b", gpus="8", fsdp="8", ep="3", batch="8")
    assert any("ep must divide n_experts" in e.value for e in at.error)
    at = _app(gpus="8", fsdp="8", ep="2", batch="8")
    assert not at.exception
    assert any("ep > 1 needs a mixture-of-experts model" in e.value for e in at.error)


def test_combined_1f1b_is_an_input_and_what_megatron_refuses_is_a_message():
    """The all-to-all overlap toggle shortens the step of an expert-parallel Megatron run
    that fits (the planner's layout: 2.735 -> 2.619 s); turned on for a layout Megatron
    refuses it with, it is one line in the sidebar."""
    query = {"model": "mixtral-8x7b", "gpus": "16", "framework": "megatron", "ep": "8",
             "etp": "1", "tp": "2", "sequence_parallel": "1", "pp": "2", "pp_interleave": "2",
             "cp": "2", "batch": "64", "grad_accum": "32", "seq": "4096"}  # fmt: skip
    at = _app(**query)
    assert not at.exception and not any("ep_overlap" in e.value for e in at.error)
    before = float(metric(at, "step time (s)"))
    at.checkbox(key="ep_overlap").check().run()
    assert not at.exception and not any("ep_overlap" in e.value for e in at.error)
    assert at.query_params["ep_overlap"] in ("1", ["1"])
    assert float(metric(at, "step time (s)")) < before
    at = _app(**{**query, "ep": "1", "ep_overlap": "1"})
    assert not at.exception
    assert any("ep_overlap hides expert-parallel" in e.value for e in at.sidebar.error)


def _under(at: AppTest, key: str) -> list:
    """The sidebar elements between the widget ``key`` and the next keyed widget."""
    nodes = [n for n in at.sidebar if type(n).__name__ not in ("Block", "UnknownElement")]
    start = next(i for i, n in enumerate(nodes) if getattr(n, "key", None) == key) + 1
    end = next((i for i in range(start, len(nodes)) if type(nodes[i]).__name__ != "Button"
                and getattr(nodes[i], "key", None)), len(nodes))  # fmt: skip
    return nodes[start:end]


def test_an_error_about_a_derived_input_is_under_a_widget_that_mends_it():
    """Issue 35: Llama-3-8B on 8 H100 at batch 4 names dp, which has no widget; the error
    is directly under the batch, with one click to the nearest batch and GPU count."""
    at = _app(model="llama3-8b", gpus="8")
    under = _under(at, "batch")
    assert "batch 4 does not split over the 8 data-parallel devices" in under[0].value
    assert [b.label for b in under[1:]] == ["Use batch = 8", "Use GPUs = 4"]
    assert "Fix **batch (sequences per step)** in the sidebar" in at.main.error[0].value
    under[2].click().run()  # GPUs = 4: four replicas of one sequence each
    assert not at.exception and at.number_input(key="gpus").value == 4
    assert not [e for e in at.sidebar.error] and "on 4 × h100-sxm" in at.main.error[0].value


def test_an_error_no_value_of_its_field_mends_offers_the_field_that_does():
    at = _app(gpus="8", tp="3")  # 3 divides no GPU count that 32 heads allow
    under = _under(at, "tp")  # the degree given, not the GPUs (a probe: "Fix GPUs")
    assert "must divide gpus" in under[0].value
    assert "Fix **tensor-parallel degree" in at.main.error[0].value
    assert [b.label for b in under[1:]] == ["Use tensor-parallel degree = 2"]
    under[1].click().run()
    assert not at.error and at.number_input(key="tp").value == 2


def test_a_layout_that_does_not_fit_says_its_setup_and_applies_the_nearest_fit():
    """The verdict shows what it assumed (model, framework, degrees, micro-batch x
    accumulation, recompute) and one click makes the nearest change that fits."""
    at = _app(model="llama3-8b", gpus="8", batch="64", fsdp="1", framework="fsdp2")
    assert "Does not fit" in at.error[0].value
    assumed = next(m.value for m in at.markdown if m.value.startswith("Assumed:"))
    for said in ("**llama3-8b**", "framework fsdp2", "dp 8, fsdp 1, tp 1",
                 "micro-batch 1 per device x grad-accum 8", "recompute none"):  # fmt: skip
        assert said in assumed, said
    assert any("shard over all 8 data-parallel ranks" in m.value for m in at.markdown)
    at.button(key="apply_nearest").click().run()
    assert not at.exception and "Fits" in at.success[0].value
    assert at.number_input(key="fsdp").value == 8
    assumed = next(m.value for m in at.markdown if m.value.startswith("Assumed:"))
    assert "dp 1, fsdp 8" in assumed


def test_fsdp2_shards_over_every_data_parallel_device_unless_told():
    """The FSDP box starts empty (the framework's default), not at 1 (nothing sharded)."""
    at = _app(model="llama3-8b", gpus="8", batch="64", framework="fsdp2")
    assert at.number_input(key="fsdp").value is None
    assert "Fits" in at.success[0].value
    assert any("dp 1, fsdp 8" in m.value for m in at.markdown)
    assert "fsdp" not in at.query_params


def test_every_sidebar_input_has_a_plain_label_and_its_help():
    from costmodel.inputs import BY_KEY

    at = _app(model="mixtral-8x7b", finetune="lora")
    widgets = [n for n in at.sidebar if getattr(n, "key", None) in BY_KEY]
    assert len(widgets) >= 38
    for w in widgets:
        assert "_" not in w.label.split(" (")[0], w.label  # no capacity_factor, ep_overlap
        assert w.proto.help == BY_KEY[w.key].help.replace("``", "`"), w.key


LLAMA_CONFIG = {
    "model_type": "llama", "_name_or_path": "my-org/tiny-llama", "vocab_size": 32000,
    "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
    "num_key_value_heads": 4, "intermediate_size": 2816, "tie_word_embeddings": False,
}  # fmt: skip


def test_an_uploaded_config_is_the_model_shown_and_travels_in_the_link():
    """After a config.json upload, the preset box is gone, the model's name is shown and
    the link carries the config (not the preset); a damaged one is a warning."""
    import json

    from explorer.state import decode_config, encode_config

    data = json.dumps(LLAMA_CONFIG).encode()
    assert decode_config(encode_config(data)) == data
    at = _app(config=encode_config(data), batch="8")
    assert not at.exception
    assert not [s for s in at.sidebar.selectbox if s.key == "model"]
    assert any("model: my-org/tiny-llama" in m.value for m in at.sidebar.markdown)
    assert any("**my-org/tiny-llama**" in m.value for m in at.markdown)
    assert "model" not in at.query_params and at.query_params["config"] in (
        encode_config(data), [encode_config(data)])  # fmt: skip
    at.sidebar.button[0].click().run()  # use a preset instead
    assert at.selectbox(key="model").value == "cs336-2.7b" and "config" not in at.query_params
    at = _app(config="not-a-config")
    assert "the link's config is damaged" in at.warning[0].value
    assert metric(at, "parameters") == "3.41 B"


def test_memory_bars_that_pass_the_peak_say_why():
    """The stacked parts reach the peak (the transient makes up the rest) or, where
    gradients and activations are not live together, the chart says so and by how much."""
    from explorer import charts

    setup, _ = setup_of({**START, "grad_accum": 1})  # no gradients left by a micro-batch
    rows = charts.memory_rows(setup, "batch", [1, 2, 4])
    gib = {(r["batch"], r["component"]): r["GiB"] for r in rows}
    over = sum(x for (b, c), x in gib.items() if b == 4 and c != "peak") - gib[4, "peak"]
    assert over > 1  # the stack is taller than the peak here
    spec = charts.memory_chart(setup, "batch", [1, 2, 4]).to_dict()
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "transient: what the peak holds beyond the parts" in subtitle
    assert "not live at the same moment" in subtitle and "at batch 4" in subtitle
    setup, _ = setup_of({**START, "gpus": 8, "fsdp": 8, "batch": 64})  # accumulating
    spec = charts.memory_chart(setup, "batch", [64, 128]).to_dict()
    assert "not live" not in " ".join(spec["title"]["subtitle"])


def test_the_book_never_answers_a_critical_batch_of_zero():
    """On one device there is no FSDP or TP communication: the book's B* is 0, which is
    said in words, not shown as a batch."""
    at = _app()
    assert not any("critical batch (book" in m.label for m in at.metric)
    assert not any(x.value.replace(" ", "") == "B^*=0" for x in at.latex)
    assert any("compute-bound at any batch" in i.value for i in at.info)
    at = _app(gpus="8", fsdp="8", batch="64")
    assert metric(at, "critical batch (book, tokens per step)") != "0"
