"""Hugging Face config.json files map onto the presets exactly."""

from __future__ import annotations

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
    with pytest.raises(ValueError, match="cannot read"):
        model_from_hf_config(path)


def test_uploaded_config_is_parsed_like_a_file():
    from costmodel.catalog.hf import model_from_hf_dict

    with pytest.raises(ValueError, match="JSON object"):
        model_from_hf_dict([1, 2], "upload.json")
    with pytest.raises(ValueError, match=r"upload\.json"):
        model_from_hf_dict({"model_type": "gemma"}, "upload.json")
