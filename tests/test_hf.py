"""Hugging Face config.json files map onto the presets exactly."""

from __future__ import annotations

import contextlib
import json

import pytest

from costmodel import TrainSpec, estimate, get_model
from costmodel.catalog.hf import model_from_hf_config

# Fields as published in the models' config.json files.
LLAMA3_8B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "max_position_embeddings": 8192,
}
GPT2 = {
    "model_type": "gpt2",
    "vocab_size": 50257,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_positions": 1024,
    "activation_function": "gelu_new",
}
QWEN2_0_5B = {
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}


def write(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def params(spec):
    return estimate(spec, TrainSpec(seq=128))["params.total"]


def test_llama_config_equals_preset(tmp_path):
    spec = model_from_hf_config(write(tmp_path, LLAMA3_8B))
    assert params(spec) == params(get_model("llama3-8b")) == 8_030_261_248


def test_gpt2_config_equals_preset(tmp_path):
    assert params(model_from_hf_config(write(tmp_path, GPT2))) == 124_439_808


def test_qwen2_has_qkv_biases(tmp_path):
    # Qwen2-0.5B: 494,032,768 parameters (sum of numel of the released checkpoint).
    spec = model_from_hf_config(write(tmp_path, QWEN2_0_5B))
    assert spec.qkv_bias and not spec.bias
    assert params(spec) == 494_032_768


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({**LLAMA3_8B, "model_type": "gemma"}, "model_type must be one of"),
        ({k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"}, "'hidden_size' is missing"),
        ({**LLAMA3_8B, "hidden_act": "gelu"}, "hidden_act must be one of silu, swish"),
    ],
)
def test_unsupported_configs_are_clear_errors(tmp_path, cfg, message):
    with pytest.raises(ValueError, match=message):
        model_from_hf_config(write(tmp_path, cfg))


def test_unreadable_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        model_from_hf_config(path)
    with pytest.raises(ValueError, match=r"missing\.json does not exist"):
        model_from_hf_config(tmp_path / "missing.json")


def test_uploaded_config_is_parsed_like_a_file():
    from costmodel.catalog.hf import model_from_hf_dict

    with pytest.raises(ValueError, match="JSON object"):
        model_from_hf_dict([1, 2], "upload.json")
    with pytest.raises(ValueError, match=r"upload\.json"):
        model_from_hf_dict({"model_type": "gemma"}, "upload.json")


# Hardening (issue 15): every malformed config is one sentence naming the field.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from costmodel.catalog.files import MAX_BYTES  # noqa: E402
from costmodel.catalog.hf import model_from_hf_dict, parse_config  # noqa: E402


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be an integer >= 1"),
        ({"num_local_experts": 8}, "model_type 'llama' is not modelled (num_local_experts=8)"),
        ({"n_routed_experts": 256}, "mixture-of-experts"),
        ({"model_type": ["llama"]}, "model_type must be a string"),
        ({"hidden_act": {"a": 1}}, "hidden_act must be a string"),
        ({"_name_or_path": 3}, "_name_or_path must be a string"),
        ({"head_dim": -1}, "head_dim must be an integer >= 1"),
    ],
)
def test_malformed_llama_fields_are_named(change, words):
    with pytest.raises(ValueError) as err:
        model_from_hf_dict({**LLAMA3_8B, **change})
    assert words in str(err.value)


def test_the_model_is_named_by_name_or_path(tmp_path):
    path = tmp_path / "snapshot" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**LLAMA3_8B, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}))
    assert model_from_hf_config(path).name == "meta-llama/Meta-Llama-3-8B"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b'{"model_type": "\xff"}', "not UTF-8 text (byte 0xff at offset 16)"),
        (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
        (b"{not json", "not valid JSON"),
        (b" " * (MAX_BYTES + 1), "larger than 16 MiB"),
    ],
)
def test_unparseable_bytes_are_one_sentence(data, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_config(data)


def test_an_endless_file_is_refused_before_it_is_read():
    with pytest.raises(ValueError, match="is not a regular file"):
        model_from_hf_config("/dev/zero")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**20) | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([LLAMA3_8B, GPT2]), st.data())
def test_any_json_value_in_any_field_is_a_spec_or_a_value_error(base, data):
    key = data.draw(st.sampled_from(sorted(base)), label="field")
    value = data.draw(JSON, label="value")
    with contextlib.suppress(ValueError):  # SpecError is one: a sentence, never a TypeError
        model_from_hf_dict({**base, key: value})


# Sliding windows (issue 34, item 3): configs as published (Hugging Face config.json).
GEMMA2_2B = {
    "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 2304, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "intermediate_size": 9216, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
    "sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
}  # fmt: skip
GEMMA3_4B = {  # the multimodal wrapper: its text decoder, the pattern by sliding_window_pattern
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560,
        "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "intermediate_size": 10240, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072, "sliding_window": 1024, "sliding_window_pattern": 6,
    },
    "vision_config": {"model_type": "siglip_vision_model"},
}  # fmt: skip
GPT_OSS_20B = {
    "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880, "num_hidden_layers": 24,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "intermediate_size": 2880, "hidden_act": "silu", "num_local_experts": 32,
    "num_experts_per_tok": 4, "experts_per_token": 4, "attention_bias": True,
    "tie_word_embeddings": False, "max_position_embeddings": 131072, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "swiglu_limit": 7.0,
}  # fmt: skip
MISTRAL_7B_V01 = {**LLAMA3_8B, "model_type": "mistral", "vocab_size": 32000,
                  "max_position_embeddings": 32768, "sliding_window": 4096}  # fmt: skip


def _as_preset(spec, name):
    return spec.replace(name=name) == get_model(name)


@pytest.mark.parametrize(
    ("cfg", "preset"),
    [
        (GEMMA2_2B, "gemma-2-2b"),  # Gemma 2: every other layer global, implicitly
        (GEMMA3_4B, "gemma-3-4b"),
        (GPT_OSS_20B, "gpt-oss-20b"),
        ({**GPT_OSS_20B, "num_hidden_layers": 36, "num_local_experts": 128,
          "layer_types": ["sliding_attention", "full_attention"] * 18}, "gpt-oss-120b"),
        (MISTRAL_7B_V01, "mistral-7b-v0.1"),  # every layer local
        ({**MISTRAL_7B_V01, "sliding_window": None}, "mistral-7b"),  # v0.2 on
    ],
)  # fmt: skip
def test_windowed_configs_equal_the_presets(cfg, preset):
    assert _as_preset(model_from_hf_dict(cfg), preset)


def test_gemma3_layer_types_give_the_same_pattern():
    text = {k: v for k, v in GEMMA3_4B["text_config"].items() if k != "sliding_window_pattern"}
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)]
    spec = model_from_hf_dict({**text, "layer_types": types})
    assert _as_preset(spec, "gemma-3-4b")


@pytest.mark.parametrize(
    ("change", "window"),
    [
        ({"sliding_window": 4096, "use_sliding_window": False}, (0, 0)),  # Qwen2's
        ({"sliding_window": 4096}, (0, 0)),  # Qwen's default: use_sliding_window false
        ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 0}, (4096, 0)),
        ({"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 24}, (0, 0)),
        ({"sliding_window": 512, "use_sliding_window": True,
          "layer_types": ["sliding_attention", "full_attention"] * 12}, (512, 2)),
    ],
)  # fmt: skip
def test_qwen_windows_follow_use_sliding_window(change, window):
    spec = model_from_hf_dict({**QWEN2_0_5B, **change})
    assert (spec.sliding_window, spec.global_every) == window


def test_all_full_layer_types_are_no_window():
    spec = model_from_hf_dict({**GPT_OSS_20B, "layer_types": ["full_attention"] * 24})
    assert (spec.sliding_window, spec.global_every) == (0, 0)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"layer_types": ["sliding_attention", "full_attention", "full_attention"] * 8},
         "layer_types must make every n-th layer full_attention"),
        ({"layer_types": ["full_attention", "sliding_attention"] * 12},
         "layer_types must make every n-th layer full_attention"),
        ({"layer_types": ["sliding_attention"] * 23}, "layer_types must name"),
        ({"layer_types": ["local"] * 24}, "layer_types must name"),
        ({"layer_types": [{"a": 1}] * 24}, "layer_types must name"),
        ({"sliding_window": None}, "sliding_window must be an integer >= 1"),
        ({"sliding_window": -3}, "sliding_window must be an integer >= 0"),
        ({"attention_bias": False}, "attention_bias must be true for gpt_oss"),
    ],
)  # fmt: skip
def test_unmodelled_window_patterns_are_refused_naming_the_field(change, words):
    with pytest.raises(ValueError, match=words):
        model_from_hf_dict({**GPT_OSS_20B, **change})


def test_qwen_windows_on_the_last_layers_only_are_refused():
    change = {"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 21}
    with pytest.raises(ValueError, match="max_window_layers"):
        model_from_hf_dict({**QWEN2_0_5B, **change})


def test_serve_takes_a_config_json_with_its_trained_positions(tmp_path, capsys):
    """Issue 60's probe: ``serve`` and its 128k-context question had no ``--hf-config``
    (only ``--rope-scaling`` on a preset of 8,192 positions)."""
    from costmodel.cli import main

    long = {**LLAMA3_8B, "max_position_embeddings": 131072}
    argv = ["serve", "--input", "100000", "--output", "500", "--batch", "1"]
    assert main([*argv, "--hf-config", str(write(tmp_path, long))]) == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "fits" in out
    assert main([*argv, "--model", "llama3-8b"]) == 2  # the preset's 8,192 positions
    assert "8,192 positions" in capsys.readouterr().err


def test_rl_takes_a_config_json_and_prices_it_as_the_preset(tmp_path, capsys):
    """Issue 60's probe: ``rl`` had no ``--hf-config`` where ``estimate`` and ``serve`` do;
    Llama-3-8B's config.json is the preset, so the step is the preset's to the digit."""
    from costmodel.cli import main

    argv = ["rl", "--gpus", "8", "--prompts", "16", "--input", "256", "--output", "512",
            "--json"]  # fmt: skip
    assert main([*argv, "--hf-config", str(write(tmp_path, LLAMA3_8B))]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main([*argv, "--model", "llama3-8b"]) == 0
    preset = json.loads(capsys.readouterr().out)
    assert from_file["rl"]["step_s"] == preset["rl"]["step_s"] > 0


def test_a_config_is_named_by_its_file_not_its_folder(tmp_path):
    """Issue 60's fifth probe: ``--hf-config /tmp/probe5-cli/llama31.json`` named the model
    "probe5-cli", its folder. A file other than config.json names it; config.json's folder
    (a downloaded checkpoint's) still does, and the config's own name first."""
    (tmp_path / "llama31.json").write_text(json.dumps(LLAMA3_8B))
    assert model_from_hf_config(tmp_path / "llama31.json").name == "llama31"
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    assert model_from_hf_config(folder / "config.json").name == "Meta-Llama-3-8B"
    named = {**LLAMA3_8B, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}
    (tmp_path / "x.json").write_text(json.dumps(named))
    assert model_from_hf_config(tmp_path / "x.json").name == "meta-llama/Meta-Llama-3-8B"
