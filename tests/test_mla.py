"""Multi-head latent attention (``ModelSpec.kv_lora_rank``): DeepSeek-V3 and DeepSeek-V2-Lite
against their published sizes, MLA by hand, their Hugging Face configs, and what is refused.
Exactness against torch's counters (parameters, FLOPs by op, bytes saved and alive after
forward) runs in ``test_accounting`` for every preset, DeepSeek-V3 at full scale included."""

from __future__ import annotations

import pytest

from costmodel import ModelSpec, ParallelSpec, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.hf import model_from_hf_dict
from costmodel.parallel.gemms import all_gemms
from costmodel.parallel.state import params_per_device
from costmodel.single.params import param_breakdown
from costmodel.specs.checks import SpecError
from costmodel.symbols import Y, values_for
from validate.probes.accounting import compare

# Fields as published in deepseek-ai/DeepSeek-V3 and DeepSeek-V2-Lite config.json.
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840,
    "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}  # fmt: skip
DEEPSEEK_V2_LITE = {
    **DEEPSEEK_V3, "model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2,
    "n_routed_experts": 64, "q_lora_rank": None, "num_experts_per_tok": 6,
    "first_k_dense_replace": 1, "norm_topk_prob": False, "topk_method": "greedy",
    "scoring_func": "softmax", "n_group": 1, "topk_group": 1,
}  # fmt: skip


def test_published_sizes():
    """DeepSeek-V3 Technical Report: 671B parameters, 37B activated per token (the
    multi-token-prediction module apart); DeepSeek-V2, App. B: V2-Lite 15.7B and 2.4B.
    DeepSeek counts the activated ones without the input embedding (a lookup): with it
    they are 37.6B and 2.66B."""
    v3 = estimate(get_model("deepseek-v3"), TrainSpec())
    assert round(v3["params.total"] / 1e9) == 671
    assert round((v3["params.active"] - v3["params.embedding"]) / 1e9) == 37
    lite = estimate(get_model("deepseek-v2-lite"), TrainSpec())
    assert round(lite["params.total"] / 1e9, 1) == 15.7
    assert int((lite["params.active"] - lite["params.embedding"]) / 1e8) == 24


def test_mla_block_by_hand():
    """DeepSeek-V3's attention per block: query D -> 1536 -> 128 x 192, latent D -> 512 + 64,
    up-projection 512 -> 128 x (128 + 128), out 128 x 128 -> D; 187,105,280 weights, 2 per
    token each in FLOPs; the core's heads 192 wide (the fused kernel's values padded)."""
    model = get_model("deepseek-v3")
    est = estimate(model, TrainSpec(batch=1, seq=4096))
    d, heads = 7168, 128
    weights = {"attn_q": d * 1536 + 1536 * heads * 192, "attn_k": d * (512 + 64),
               "attn_v": 512 * heads * 256, "attn_o": heads * 128 * d}  # fmt: skip
    assert sum(weights.values()) == 187_105_280
    for op, n in weights.items():
        assert est[f"params.{op}"] == 61 * n
        assert est[f"flops.forward_by_op.{op}"] == 61 * 2 * 4096 * n
    assert est["flops.forward_by_op.attn_scores"] == 61 * 2 * heads * 4096**2 * 192
    assert est["flops.forward_by_op.attn_values"] == 61 * 2 * heads * 4096**2 * 192
    naive = estimate(model, TrainSpec(batch=1, seq=4096, attention="naive"))
    assert naive["flops.forward_by_op.attn_values"] == 61 * 2 * heads * 4096**2 * 128
    # kept per token: the latent (576 wide) with its statistic and normed copy, the query's
    # latent likewise, query and key (192 per head), padded values and output, logsumexp,
    # and the out-projection's input (128 per head), in bf16
    latents = 2 * 576 + 4 + 2 * 512 + 2 * 1536 + 4 + 2 * 1536
    core = 4 * 2 * heads * 192 + 4 * heads + 2 * heads * 128
    per_block = est["memory_bytes.activations_by_op.mla_latents"] + est[
        "memory_bytes.activations_by_op.attention"] + est[
        "memory_bytes.activations_by_op.attn_out_input"]  # fmt: skip
    assert per_block == 61 * 4096 * (latents + core)


def test_hf_configs_equal_the_presets():
    for cfg, name in ((DEEPSEEK_V3, "deepseek-v3"), (DEEPSEEK_V2_LITE, "deepseek-v2-lite")):
        assert model_from_hf_dict(cfg).replace(name=name) == get_model(name)


def test_a_latent_model_without_experts_is_exact():
    """MLA in a small dense model, with and without a query latent, run on real values."""
    base = ModelSpec(vocab=128, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=96,
                     kv_lora_rank=32, rope_head_dim=8, v_head_dim=12, max_positions=64)  # fmt: skip
    for q_lora in (0, 24):
        for attention, recompute in (("flash", "none"), ("naive", "selective")):
            train = TrainSpec(batch=2, seq=32, attention=attention, recompute=recompute)
            rows = compare(base.replace(q_lora_rank=q_lora), train, device="cpu")
            assert [r for r in rows if r["predicted"] != r["measured"]] == []


def test_runs_on_a_cluster_with_experts_and_pipeline():
    """DeepSeek-V3 on 256 H100s: ep 8 within fsdp 32, pp 8, every count positive."""
    model, hw = get_model("deepseek-v3"), get_hardware("h100-sxm")
    train = TrainSpec(batch=512, seq=4096, grad_accum=16, recompute="full")
    est = estimate(model, train, ParallelSpec(fsdp=32, ep=8, pp=8, framework="fsdp2"), hw)
    assert 0 < est["mfu"] < 1 and est["memory_bytes_per_device.peak"] > 0


def _dense_lite() -> ModelSpec:
    """DeepSeek-V2-Lite's attention (no query latent) over a dense FFN, with a query latent
    of 128 to cover both query paths."""
    return get_model("deepseek-v2-lite", n_experts=0, experts_per_token=0, n_shared_experts=0,
                     dense_layers=0, moe_renormalize=True, q_lora_rank=128)  # fmt: skip


@pytest.mark.parametrize("q_lora", [0, 128])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mla_under_tensor_parallelism_splits_heads_and_keeps_the_down_projections(
    q_lora, sequence_parallel
):
    """Megatron-Core's MLASelfAttention: up-projections and O split by heads, the
    down-projections to the latents whole on every rank (TELinear 'duplicated'), run on the
    rank's sequence shard under sequence parallelism. Per device: parameters and matmul
    FLOPs per token by hand."""
    model = _dense_lite().replace(q_lora_rank=q_lora)
    d, heads, qk, v, r_kv, r_q = 2048, 16, 128 + 64, 128, 512, q_lora
    down = d * (r_kv + 64) + d * r_q
    split = heads * qk * (r_q or d) + r_kv * heads * (128 + v) + heads * v * d
    values = {**values_for(model), Y: 2}
    gemms = all_gemms(model, None, sequence_parallel)
    per_token = {op: sum(2 * rows * k * n2 * c for rows, k, n2, c in g).subs(values)
                 for op, g in gemms.items() if op.startswith("attn_")}  # fmt: skip
    assert sum(per_token.values()) == 2 * (split // 2 + (down // 2 if sequence_parallel else down))
    one, two = (params_per_device(model, ParallelSpec(tp=t))[0].subs({**values, Y: t})
                for t in (1, 2))  # fmt: skip
    norms = param_breakdown(model)["norms"].subs(values)
    assert two == (one - norms) / 2 + norms + model.n_layers * down // 2


def test_mla_tensor_parallel_collectives_gather_the_latents():
    """Under sequence parallelism an MLA block gathers its latents (query latent or input,
    key/value latent, RoPE key) and reduce-scatters D, where a standard block gathers and
    reduce-scatters D: the difference in bytes is m·L·(2(Y-1)/Y)·2·b·T·(g - D) each way,
    and Megatron gathers the saved shards again in backward (half of it once more)."""
    hw, train = get_hardware("h100-sxm"), TrainSpec(batch=8, seq=256, grad_accum=1)
    mla = _dense_lite()
    standard = mla.replace(kv_lora_rank=0, q_lora_rank=0, rope_head_dim=0, v_head_dim=None)
    par = ParallelSpec(tp=2, dp=4, sequence_parallel=True, framework="megatron")
    got = [estimate(m, train, par, hw)["comm_bytes.tp"] for m in (mla, standard)]
    tokens, gathered = 2 * 256, 128 + 512 + 64  # a device's micro-batch: 2 sequences
    assert got[0] - got[1] == 27 * 1 * 2 * tokens * (gathered - 2048) * 5 // 4


def test_mla_ring_attention_passes_its_heads_widths():
    """Context parallelism passes each head's key (d_h + d_r) and value (padded to it for
    the fused kernel) around the ring: H x 192 + H x 192 per token for V2-Lite's heads,
    where a standard model with as many 128-wide heads passes H x 128 twice."""
    hw, train = get_hardware("h100-sxm"), TrainSpec(batch=8, seq=256, grad_accum=1)
    mla = _dense_lite()
    standard = mla.replace(kv_lora_rank=0, q_lora_rank=0, rope_head_dim=0, v_head_dim=None)
    par = ParallelSpec(cp=2, fsdp=4, framework="fsdp2")
    got = [estimate(m, train, par, hw)["comm_bytes.cp"] for m in (mla, standard)]
    assert got[0] * 128 == got[1] * 192


@pytest.mark.parametrize(("spec", "train", "par", "field"), [
    ({}, {"elementwise": "eager"}, None, "elementwise"),
    ({"n_kv_heads": 8}, {}, None, "n_kv_heads"),
    ({"rope_head_dim": 63}, {}, None, "rope_head_dim"),
    ({"kv_lora_rank": 0}, {}, None, "q_lora_rank"),
    ({"kv_lora_rank": 0, "q_lora_rank": 0, "rope_head_dim": 0, "v_head_dim": 64}, {}, None,
     "v_head_dim"),
])  # fmt: skip
def test_what_is_not_modelled_is_refused(spec, train, par, field):
    lite = _dense_lite()
    hw = get_hardware("h100-sxm")
    with pytest.raises(SpecError) as err:
        layout = ParallelSpec(**par) if par else None
        estimate(lite.replace(**spec), TrainSpec(batch=8, seq=256, **train), layout,
                 hw if layout else None)  # fmt: skip
    assert err.value.field == field
