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
    assert (table["rounds"] * table["sequences per round"] == 68).all()
    assert not [c for c in table.columns if "_" in c]  # words, not the planner's keys
    assert "compute-bound" in at.markdown[0].value
    assert len(at.get("vega_lite_chart")) == 2
    at.number_input[2].set_value(2.0)  # device budget: 2 GB
    at.button[0].click().run()
    assert not at.exception
    assert "device budget must be >=" in at.error[0].value  # in words, not a field name


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


def _query(at: AppTest) -> dict[str, str]:
    return {k: v[0] if isinstance(v, list) else v for k, v in dict(at.query_params).items()}


def test_padding_page_starts_from_the_estimate_follows_it_and_keeps_its_link():
    at = AppTest.from_function(_padding, default_timeout=300)
    at.session_state["_estimate_inputs"] = {"model": "gpt2", "hardware": "a100-80gb",
                                            "gpus": 4, "seq": 1024, "batch": 16}  # fmt: skip
    at.run()
    assert not at.exception and not at.error
    assert at.selectbox(key="padding_model").value == "gpt2"
    assert "rows of 1,024 tokens, 16 rows per step" in at.caption[0].value
    at.text_input(key="padding_distribution").set_value("lognormal:median=300,sigma=0.5")
    at.button[0].click().run()
    query = _query(at)
    assert query["distribution"] == "lognormal:median=300,sigma=0.5" and query["gpus"] == "4"
    again = AppTest.from_function(_padding, default_timeout=300)
    for key, value in query.items():
        again.query_params[key] = value
    again.run()
    assert again.dataframe[0].value.equals(at.dataframe[0].value)
    # the Estimate page's model changes: the page follows it, keeping its own inputs
    at.session_state["_estimate_inputs"] = {"model": "gpt2-medium", "hardware": "a100-80gb",
                                            "gpus": 4, "seq": 1024, "batch": 16}  # fmt: skip
    at.run()
    assert at.selectbox(key="padding_model").value == "gpt2-medium"
    assert at.text_input(key="padding_distribution").value == "lognormal:median=300,sigma=0.5"


def test_offload_page_starts_from_the_estimates_model():
    at = AppTest.from_function(_offload, default_timeout=300)
    at.session_state["_estimate_inputs"] = {"model": "gpt2", "seq": 1024, "batch": 8}
    at.run()
    assert not at.exception
    assert at.selectbox(key="offload_model").value == "gpt2"
    query = _query(at)
    assert query["model"] == "gpt2" and query["batch"] == "8" and query["device_gb"] == "30"


def test_messages_on_pages_are_in_words_not_flags_or_field_names():
    """A probe: the pages said ``deadline_days``, ``request_rate`` and ``--tp 4``."""
    from explorer.labels import in_words

    said = in_words("--tp 4 or --rope-scaling; request_rate (100/s) needs sequence_parallel")
    assert said == "tp 4 or rope scaling; request rate (100/s) needs sequence parallel"
    assert in_words("seq-len stays; a-b --x") == "seq-len stays; a-b x"


def test_the_padding_page_draws_and_cuts_the_documents_as_the_cli_does(capsys):
    """A probe: the page drew lengths capped at the row (mean 1,028.0) where ``padding``
    draws them whole and cuts them with a note (mean 1,034.2; 212 documents cut)."""
    from costmodel.cli import main

    inputs = {"model": "llama3-8b", "hardware": "h100-sxm", "gpus": 8, "seq": 8192,
              "batch": 64}  # fmt: skip
    at = AppTest.from_function(_padding, default_timeout=300)
    at.session_state["_estimate_inputs"] = inputs
    at.run()
    assert not at.exception
    assert main(["padding", *(f"--{k}={v}" for k, v in inputs.items()),
                 "--distribution", "lognormal:median=721,sigma=0.85"]) == 0  # fmt: skip
    cli = capsys.readouterr().out.splitlines()
    shown = [c.value for c in at.caption]
    assert cli[0].startswith("verdict: does not fit") and "Does not fit" in at.error[0].value
    assert cli[1].split(", rows")[0] in shown[0]  # 100,000 documents, mean 1,034.2 tokens
    assert shown[1].startswith("212 documents (0.2%) are longer than a row")


def test_the_offload_page_streams_over_the_devices_own_host_link_as_the_cli():
    """Issue 60's fourth probe: every device streamed over PCIe 5; the page's default link
    is now the device's own (an A100's PCIe 4), as the CLI's without --link."""
    at = AppTest.from_function(_offload, default_timeout=300)
    at.query_params["hardware"] = "a100-80gb"
    at.run()
    assert not at.exception and at.session_state["offload_link"] == "device"
    steps = {"device": at.dataframe[0].value["step (s)"].tolist()}
    for link in ("pcie4", "pcie5"):
        at.selectbox(key="offload_link").set_value(link)
        at.button[0].click().run()
        steps[link] = at.dataframe[0].value["step (s)"].tolist()
    assert steps["device"] == steps["pcie4"] != steps["pcie5"]


def test_the_padding_page_prices_the_framework_it_shows():
    """Issue 60's fourth probe: the Padding page priced the reference framework (76.5k
    tokens/s) where the Estimate page priced FSDP2 (81.7k) with no framework input; it now
    has one, taken from the Estimate page."""
    at = AppTest.from_function(_padding, default_timeout=300)
    at.session_state["_estimate_inputs"] = {"model": "llama3-8b", "hardware": "h100-sxm",
                                            "gpus": 8, "seq": 4096, "batch": 32,
                                            "framework": "fsdp2"}  # fmt: skip
    at.run()
    assert not at.exception and at.session_state["padding_framework"] == "fsdp2"
    fsdp2 = at.dataframe[0].value["tokens/s"].tolist()
    at.selectbox(key="padding_framework").set_value("reference")
    at.button[0].click().run()
    assert at.dataframe[0].value["tokens/s"].tolist() != fsdp2


def test_a_page_says_the_uploaded_config_is_not_carried():
    """Issue 60's fifth probe: after a config.json upload on the Estimate page, Padding
    (and Plan) priced llama3-8b with no note, the GPUs, seq and batch carried over."""
    from explorer.page_state import ESTIMATE, UPLOADED

    at = AppTest.from_function(_padding, default_timeout=300)
    at.session_state[ESTIMATE] = {"gpus": 8, "seq": 2048, "batch": 16}
    at.session_state[UPLOADED] = True
    at.run()
    assert not at.exception
    assert any("config.json uploaded on the Estimate page is not carried" in i.value
               for i in at.info)  # fmt: skip
    plain = AppTest.from_function(_padding, default_timeout=300)
    plain.session_state[ESTIMATE] = {"gpus": 8, "seq": 2048, "batch": 16}
    plain.run()
    assert not any("uploaded" in i.value for i in plain.info)


def test_the_padding_page_says_its_verdict_and_layout_first():
    """Issue 60's sixth probe: the Padding page showed speeds with no verdict and sharded
    over every GPU unsaid, where the CLI's padding (DDP without --fsdp) did not fit."""
    at = AppTest.from_function(_padding, default_timeout=300).run()
    assert not at.exception and at.success
    said = at.success[0].value
    assert said.startswith("Fits: peak") and said.endswith("(reference, ZeRO-3 over fsdp 8)")


def test_the_padding_pages_sharding_is_an_input_as_the_clis_fsdp(capsys):
    """Issue 60's seventh probe: the page sharded over every GPU, said only in a tooltip, so
    its "Fits" met the CLI's "does not fit" (padding without --fsdp) for the same visible
    inputs. Sharding is now an input beside the GPUs; "none" is the CLI's default."""
    from costmodel.cli import main

    at = AppTest.from_function(_padding, default_timeout=300).run()
    assert at.session_state["padding_sharding"] == "every GPU"
    assert "Fits" in (at.success or at.warning)[0].value
    at.selectbox(key="padding_sharding").set_value("none (DDP replicas)")
    at.button[0].click().run()
    assert not at.exception and "Does not fit" in at.error[0].value
    argv = [
        "padding",
        "--model",
        "llama3-8b",
        "--hardware",
        "h100-sxm",
        "--seq",
        "4096",
        "--batch",
        "32",
        "--gpus",
        "8",
        "--distribution",
        "lognormal:median=721,sigma=0.85",
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("verdict: does not fit")
