"""Qwen: Qwen3's QK-norm (``ModelSpec.qk_norm``), Qwen2-MoE's gated shared experts and
unnormalised top-k weights (``shared_expert_gate``, ``moe_renormalize``), the presets
against their published sizes, and their Hugging Face configs. Exactness against torch's
counters runs in ``test_accounting`` (every preset), ``test_moe`` (kernels, traffic, real
routing), ``test_kernels`` and ``test_traffic``."""

from __future__ import annotations

import pytest

from costmodel import ParallelSpec, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.hf import model_from_hf_dict
from costmodel.specs.checks import SpecError

# Fields as published in Qwen/Qwen3-8B and Qwen/Qwen3-30B-A3B config.json.
QWEN3_8B = {
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 12288, "hidden_act": "silu", "tie_word_embeddings": False,
    "max_position_embeddings": 40960, "attention_bias": False,
}  # fmt: skip
QWEN3_30B_A3B = {
    **QWEN3_8B, "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "intermediate_size": 6144, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [],
}  # fmt: skip
# Qwen/Qwen1.5-MoE-A2.7B config.json
QWEN15_MOE = {
    "model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "intermediate_size": 5632, "hidden_act": "silu", "tie_word_embeddings": False,
    "max_position_embeddings": 8192, "num_experts": 60, "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
}  # fmt: skip


def test_published_sizes():
    """Qwen3 Technical Report, Tables 1-2 and the model cards: Qwen3-8B 8.2B parameters,
    6.95B without embeddings; Qwen3-30B-A3B 30.5B, 29.9B without embeddings, 3.3B active."""
    dense = estimate(get_model("qwen3-8b"), TrainSpec())
    assert round(dense["params.total"] / 1e9, 1) == 8.2
    assert round(dense["params.non_embedding"] / 1e9, 2) == 6.95
    moe = estimate(get_model("qwen3-30b-a3b"), TrainSpec())
    assert round(moe["params.total"] / 1e9, 1) == 30.5
    assert round(moe["params.non_embedding"] / 1e9, 1) == 29.9
    assert int(moe["params.active"] / 1e8) == 33  # 3.35 B: the card truncates it to 3.3 B


def test_qk_norm_by_hand():
    """Two RMSNorm gains of d_h per block; kept for backward: the Q and K projections'
    outputs (bf16) and one fp32 statistic per head and token; no FLOPs."""
    base = get_model("qwen3-8b")
    train = TrainSpec(batch=2, seq=512)
    with_norm, without = estimate(base, train), estimate(base.replace(qk_norm=False), train)
    assert with_norm["params.norms"] - without["params.norms"] == 36 * 2 * 128
    tokens, heads = 2 * 512, 32 + 8
    kept = 36 * tokens * heads * (2 * 128 + 4)
    assert with_norm["memory_bytes.activations_by_op.qk_norm"] == kept
    assert with_norm["memory_bytes.activations"] - without["memory_bytes.activations"] == kept
    assert with_norm["flops.step"] == without["flops.step"]


def test_qk_norm_splits_over_tensor_parallel_heads():
    """Under tp each rank normalises its own heads: a quarter of what QK-norm keeps at tp 4
    (one sequence of 2,048 tokens per micro-batch)."""
    model, hw = get_model("qwen3-8b"), get_hardware("h100-sxm")
    train, key = TrainSpec(batch=8, seq=2048, grad_accum=8), "memory_bytes_per_device.activations"
    with_norm, without = (estimate(m, train, ParallelSpec(tp=4), hw)
                          for m in (model, model.replace(qk_norm=False)))  # fmt: skip
    assert with_norm[key] - without[key] == 36 * 2048 * (32 + 8) * (2 * 128 + 4) / 4


def test_hf_configs_equal_the_presets():
    for cfg, name in ((QWEN3_8B, "qwen3-8b"), (QWEN3_30B_A3B, "qwen3-30b-a3b"),
                      (QWEN15_MOE, "qwen1.5-moe-a2.7b")):  # fmt: skip
        assert model_from_hf_dict(cfg).replace(name=name) == get_model(name)
    unnormalised = model_from_hf_dict({**QWEN3_30B_A3B, "norm_topk_prob": False})
    assert not unnormalised.moe_renormalize and not unnormalised.shared_expert_gate


def test_qwen15_moe_published_sizes():
    """Qwen1.5-MoE-A2.7B: "14.3B parameters in total and 2.7B activated" (Qwen blog)."""
    est = estimate(get_model("qwen1.5-moe-a2.7b"), TrainSpec())
    assert round(est["params.total"] / 1e9, 1) == 14.3
    assert round(est["params.active"] / 1e9, 1) == 2.7


def test_shared_gate_and_unnormalised_weights_by_hand():
    """The gate: a D-wide weight per MoE block, 2·D FLOPs per token, and kept for backward
    its sigmoid and the shared output it scales (a + a·D bytes per token); unnormalised
    top-k weights keep neither the k fp32 values nor their sum (4k + 4 bytes per token)."""
    model = get_model("qwen1.5-moe-a2.7b")
    plain = model.replace(shared_expert_gate=False, moe_renormalize=True)
    train = TrainSpec(batch=2, seq=256)
    qwen, other = estimate(model, train), estimate(plain, train)
    tokens, D, k = 2 * 256, 2048, 4
    assert qwen["params.router"] - other["params.router"] == 24 * D
    assert qwen["flops.forward_by_op.router"] - other["flops.forward_by_op.router"] == (
        24 * 2 * tokens * D)  # fmt: skip
    gate, renorm = 24 * tokens * (2 + 2 * D), 24 * tokens * (4 * k + 4)
    assert qwen["memory_bytes.activations"] - other["memory_bytes.activations"] == gate - renorm


@pytest.mark.parametrize(("cfg", "change", "words"), [
    (QWEN3_30B_A3B, {"decoder_sparse_step": 2}, "every block must be an MoE block"),
    (QWEN3_30B_A3B, {"mlp_only_layers": [0]}, "every block must be an MoE block"),
    (QWEN15_MOE, {"shared_expert_intermediate_size": 5000}, "must be a multiple of"),
])  # fmt: skip
def test_qwen_moe_configs_not_modelled_are_refused(cfg, change, words):
    with pytest.raises(ValueError, match=words):
        model_from_hf_dict({**cfg, **change})


def test_shared_gate_needs_shared_experts():
    with pytest.raises(SpecError, match="needs n_shared_experts") as err:
        get_model("mixtral-8x7b", shared_expert_gate=True)
    assert err.value.field == "shared_expert_gate"


def test_qk_norm_needs_attention():
    with pytest.raises(SpecError, match="qk_norm needs attention") as err:
        get_model("xxl", qk_norm=True)
    assert err.value.field == "qk_norm"
