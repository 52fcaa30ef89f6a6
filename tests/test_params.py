"""Parameter counts against published figures (exact)."""

from __future__ import annotations

import pytest

from costmodel import PRESETS, TrainSpec, estimate, get_model

# docs/ARCHITECTURE.md reference table (vocab 10,000, untied, d_ff = 4d, SwiGLU, RMSNorm).
CS336 = {
    "cs336-small": 128_625_408,
    "cs336-medium": 423_183_360,
    "cs336-large": 969_411_840,
    "cs336-xl": 1_998_235_200,
    "cs336-2.7b": 3_406_809_600,
}
# Hugging Face model cards / `sum(p.numel())` of the released checkpoints.
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
}


def total(name: str) -> int:
    return estimate(get_model(name), TrainSpec())["params.total"]


@pytest.mark.parametrize(("name", "expected"), CS336.items())
def test_reference_sizes_exact(name, expected):
    assert total(name) == expected


@pytest.mark.parametrize(("name", "expected"), PUBLISHED.items())
def test_published_counts_exact(name, expected):
    assert total(name) == expected


def test_xxl_is_two_matrices_per_block():
    # 126 blocks x (D x F + F x D), no embedding, norms or biases (docs/ARCHITECTURE.md).
    assert total("xxl") == 126 * 2 * 16384 * 53248 == 219_848_638_464


def test_gpt3_close_to_paper():
    # Brown et al. 2020 Table 2.1 quotes 175.0B (rounded). Hand count: 96 blocks of
    # 12·D² + 13·D (QKV, O, two 4D FFN matrices, their biases, two LayerNorms) plus
    # 51200·D tied embedding, 2048·D positions and the final LayerNorm 2·D, D = 12288.
    d = 12288
    expected = 96 * (12 * d * d + 13 * d) + 51200 * d + 2048 * d + 2 * d
    assert total("gpt3-175b") == expected == 174_615_846_912


@pytest.mark.parametrize("name", PRESETS)
def test_breakdown_sums_to_total(name):
    values = estimate(get_model(name), TrainSpec()).values
    parts = [
        k
        for k in values
        if k.startswith("params.")
        and k not in ("params.total", "params.non_embedding", "params.active", "params.trainable")
    ]
    assert sum(values[k] for k in parts) == values["params.total"]


def test_tied_head_has_no_parameters_of_its_own():
    untied = estimate(get_model("gpt2", tied=False), TrainSpec()).values
    tied = estimate(get_model("gpt2"), TrainSpec()).values
    assert tied["params.lm_head"] == 0
    assert untied["params.total"] - tied["params.total"] == 50257 * 768


def test_qkv_bias_adds_q_k_v_biases_only():
    base = estimate(get_model("llama3-8b"), TrainSpec()).values["params.total"]
    qkv = estimate(get_model("llama3-8b", qkv_bias=True), TrainSpec()).values["params.total"]
    assert qkv - base == 32 * (4096 + 2 * 1024)
