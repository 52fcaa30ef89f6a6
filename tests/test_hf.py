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
    with pytest.raises(ValueError, match="cannot read"):
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

from costmodel.catalog.hf import MAX_BYTES, model_from_hf_dict, parse_config  # noqa: E402


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


def test_an_endless_file_is_refused_after_the_cap():
    with pytest.raises(ValueError, match="larger than 16 MiB"):
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
