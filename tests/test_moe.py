"""Mixture-of-experts models: parameters, FLOPs, saved bytes, kernels and eager traffic
equal what the reference model's MoE block (validate/reference/moe.py) runs, with real
top-k routing on CPU; published parameter counts; the layouts and policies not modelled
yet are refused with one clear line."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from costmodel import ModelSpec, ParallelSpec, TrainSpec, estimate, get_model, sweep
from costmodel.book.bounds import bounds_report
from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.hf import model_from_hf_dict
from costmodel.engine.offload import plan_offload
from costmodel.single.elementwise import eager_bytes
from costmodel.single.kernels import counted, layer_kernels, model_kernels
from costmodel.single.params import active_params, param_breakdown
from costmodel.single.precision import PRECISIONS
from costmodel.specs.checks import SpecError
from costmodel.specs.offload import OffloadSpec
from costmodel.symbols import values_for
from validate.probes.accounting import compare
from validate.probes.dispatch import step_kernels
from validate.probes.traffic import TrafficCounter
from validate.reference.model import TransformerLM, make_batch

SMALL = ModelSpec(vocab=64, d_model=32, n_layers=3, n_heads=2, d_ff=96, max_positions=128,
                  n_experts=4, experts_per_token=2, d_ff_expert=24, n_shared_experts=1,
                  dense_layers=1)  # fmt: skip
NAIVE_DROP = {"attention": "naive", "dropout": 0.1}  # CPU's flash kernel has no dropout
CASES = {
    "fp32": (SMALL, {"precision": "fp32"}),
    "bf16-mixed": (SMALL, {}),
    "bf16": (SMALL, {"precision": "bf16"}),
    "no-shared-no-dense": (SMALL.replace(n_shared_experts=0, dense_layers=0), {}),
    "two-shared": (SMALL.replace(n_shared_experts=2), {"precision": "fp32"}),
    "top-1": (SMALL.replace(experts_per_token=1), {}),
    "gelu-bias": (SMALL.replace(ffn="gelu", bias=True), {}),
    "naive": (SMALL, {"attention": "naive"}),
    "full": (SMALL, {"recompute": "full"}),
    "selective": (SMALL, {"recompute": "selective"}),
    "dropout": (SMALL, NAIVE_DROP),
    "dropout-full": (SMALL, {**NAIVE_DROP, "recompute": "full"}),
    "qwen2-moe": (SMALL.replace(shared_expert_gate=True, moe_renormalize=False), {}),
    "gated-top-1-fp32": (
        SMALL.replace(shared_expert_gate=True, experts_per_token=1),
        {"precision": "fp32"},
    ),
    "unnormalised-full": (SMALL.replace(moe_renormalize=False), {"recompute": "full"}),
}


def _train(kw, **more) -> TrainSpec:
    return TrainSpec(batch=2, seq=16, elementwise="eager", **{**kw, **more})


@pytest.mark.parametrize("name", CASES)
def test_counts_equal_the_reference_model_with_real_routing(name):
    """Parameters by component, FLOPs (total and by op), bytes saved for backward, bytes
    alive after forward and weight casts: every count exact, whatever experts the router
    picks (the counts are per routed token and expert, summed)."""
    spec, kw = CASES[name]
    torch.manual_seed(0)
    rows = compare(spec, _train(kw), device="cpu")
    assert [r for r in rows if r["predicted"] != r["measured"]] == []
    assert {"params.router", "params.experts", "flops.forward_by_op.experts"} <= {
        r["quantity"] for r in rows
    }


@pytest.mark.parametrize("name", CASES)
def test_kernels_equal_the_reference_model(name):
    spec, kw = CASES[name]
    train = _train(kw)
    torch.manual_seed(1)
    model = TransformerLM.for_training(spec, train)
    fwd, bwd = step_kernels(model, make_batch(model, 2, 16))
    res = PRECISIONS[train.precision].residual
    dense = counted(layer_kernels(spec, train, res), spec)
    moe = counted(layer_kernels(spec, train, res, block="moe"), spec)
    outside = counted(model_kernels(spec, train, res), spec)
    n_moe = spec.n_layers - spec.dense_layers
    parts = zip(dense, moe, outside, strict=True)
    expected = [spec.dense_layers * d + n_moe * m + o for d, m, o in parts]
    assert [fwd.n, bwd.n] == expected


def _traffic(spec: ModelSpec, precision: str, seq: int) -> tuple[int, int]:
    torch.manual_seed(2)
    model = TransformerLM.for_training(spec, TrainSpec(batch=1, seq=seq, precision=precision))
    batch = make_batch(model, 1, seq)
    with TrafficCounter() as fwd:
        loss = model(batch)
    with TrafficCounter() as bwd:
        loss.backward()
    return fwd.bytes, bwd.bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
@pytest.mark.parametrize("moe", [
    SMALL, SMALL.replace(experts_per_token=1, ffn="gelu"),
    SMALL.replace(shared_expert_gate=True, moe_renormalize=False),
    SMALL.replace(shared_expert_gate=True, experts_per_token=1),
])  # fmt: skip
def test_eager_bytes_of_an_moe_block(precision, moe):
    """Per token, an MoE block's elementwise bytes over a dense block's, from one-block
    models at two lengths (what the embedding, head and loss move cancels out)."""
    moe = moe.replace(n_layers=1, dense_layers=0)
    dense = moe.replace(n_experts=0, experts_per_token=0, n_shared_experts=0,
                        shared_expert_gate=False, moe_renormalize=True)  # fmt: skip
    counts = {(m.moe, t): _traffic(m, precision, t) for m in (moe, dense) for t in (32, 64)}
    measured = [((counts[True, 64][i] - counts[False, 64][i])
                 - (counts[True, 32][i] - counts[False, 32][i])) / 32 for i in (0, 1)]  # fmt: skip
    prec, v = PRECISIONS[precision], values_for(moe)
    with_experts = eager_bytes(moe, prec.residual, prec.activation, block="moe")
    without = eager_bytes(dense, prec.residual, prec.activation)
    assert [int((a - b).subs(v)) for a, b in zip(with_experts, without, strict=True)] == measured


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        # Jiang et al. 2024, Table 1 (46.7B, 12.9B); Hugging Face's count of the checkpoint
        ("mixtral-8x7b", 46_702_792_704, 12_879_925_248),
        # Dai et al. 2024, Sec. 5.1 (16.4B, 2.8B)
        ("deepseek-moe-16b", 16_375_728_128, 2_828_650_496),
    ],
)
def test_published_parameter_counts(name, total, active):
    model = get_model(name)
    v = values_for(model)
    assert param_breakdown(model)["total"].subs(v) == total
    assert active_params(model).subs(v) == active
    values = estimate(model, TrainSpec()).values
    assert values["params.active"] == active
    assert values["flops.conventions.six_n"] == 6 * active * 4 * 1024  # what a token runs


def test_hf_configs_import_exactly():
    mixtral = {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "hidden_act": "silu", "num_local_experts": 8,
               "num_experts_per_tok": 2, "max_position_embeddings": 32768}  # fmt: skip
    deepseek = {"model_type": "deepseek", "vocab_size": 102400, "hidden_size": 2048,
                "num_hidden_layers": 28, "num_attention_heads": 16, "intermediate_size": 10944,
                "hidden_act": "silu", "n_routed_experts": 64, "num_experts_per_tok": 6,
                "moe_intermediate_size": 1408, "n_shared_experts": 2,
                "first_k_dense_replace": 1, "moe_layer_freq": 1,
                "max_position_embeddings": 4096}  # fmt: skip
    for cfg, preset in ((mixtral, "mixtral-8x7b"), (deepseek, "deepseek-moe-16b")):
        assert model_from_hf_dict(cfg).replace(name=preset) == get_model(preset)
    no_shared = model_from_hf_dict({**deepseek, "n_shared_experts": None})
    assert no_shared.n_shared_experts == 0
    with pytest.raises(ValueError, match="moe_layer_freq must be 1"):
        model_from_hf_dict({**deepseek, "moe_layer_freq": 2})
    with pytest.raises(ValueError, match="'dbrx' is not modelled"):
        model_from_hf_dict({**mixtral, "model_type": "dbrx"})
    with pytest.raises(SpecError, match=r"experts_per_token must be in 1\.\.n_experts = 8"):
        model_from_hf_dict({**mixtral, "num_experts_per_tok": 9})


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"experts_per_token": 5}, "experts_per_token", "must be in 1..n_experts = 4 .got 5"),
        ({"experts_per_token": 0}, "experts_per_token", "must be in 1..n_experts"),
        ({"dense_layers": 3}, "dense_layers", "must be below n_layers = 3 .got 3"),
        ({"n_experts": 0}, "experts_per_token", "needs n_experts >= 1"),
        ({"n_experts": -1}, "n_experts", ">= 0"),
    ],
)
def test_bad_expert_fields_name_the_field(changes, field, message):
    with pytest.raises(SpecError, match=message) as err:
        SMALL.replace(**changes)
    assert err.value.field == field


H100 = get_hardware("h100-sxm")


def test_layouts_and_policies_not_modelled_are_refused():
    model, train = get_model("mixtral-8x7b"), TrainSpec(batch=8, seq=4096)
    for par, field in ((ParallelSpec(tp=8), "tp"),
                       (ParallelSpec(fsdp=8, framework="handwritten"), "framework")):  # fmt: skip
        with pytest.raises(SpecError, match="mixture-of-experts") as err:
            estimate(model, train, par, H100)
        assert err.value.field == field
    with pytest.raises(SpecError, match="selective-op is not modelled") as err:
        estimate(model, train.replace(recompute="selective-op"))
    assert err.value.field == "recompute"
    with pytest.raises(SpecError, match="dense FFN stacks"):
        bounds_report(model, ParallelSpec(fsdp=8), H100)
    with pytest.raises(SpecError, match="offload plans are not modelled"):
        plan_offload(
            model, train, H100, OffloadSpec(device_budget=80e9, host_budget=1e12, link_bw=50e9)
        )


def test_experts_read_every_expert_once():
    """Routed experts run the FLOPs of a dense FFN k times as wide but read all E experts'
    weights, (E - k)·3·D·F_e more, and each token's input and output once per expert it
    goes to, (k - 1)·3·n·D more: a lower intensity (balanced routing, each expert's GEMMs
    over its k/E share of the n tokens)."""
    train = TrainSpec(batch=1, seq=4096, precision="bf16-mixed")
    moe = get_model("mixtral-8x7b")
    dense = get_model("mistral-7b", d_ff=2 * 14336)  # the two active experts side by side
    a = estimate(moe, train, ParallelSpec(), H100).values
    b = estimate(dense, train, ParallelSpec(), H100).values
    flops = {k: a[f"flops.forward_by_op.{k}"] for k in ("experts", "ffn")}
    assert flops["experts"] == b["flops.forward_by_op.ffn"] and flops["ffn"] == 0
    moe_bytes = flops["experts"] / 32 / a["roofline.experts.intensity"]
    dense_bytes = b["flops.forward_by_op.ffn"] / 32 / b["roofline.ffn.intensity"]
    extra = 2 * ((8 - 2) * 3 * 4096 * 14336 + (2 - 1) * 3 * 4096 * 4096)
    assert moe_bytes - dense_bytes == pytest.approx(extra, rel=1e-12)
    assert a["roofline.experts.intensity"] < b["roofline.ffn.intensity"]


def test_sweep_mixes_dense_and_moe_points():
    values = sweep(get_model("mixtral-8x7b"), quantities=("params.total", "time_s.step"),
                   hardware=H100, n_experts=np.array([0, 8, 16]),
                   experts_per_token=np.array([0, 2, 2]), fsdp=8, batch=8, seq=4096)  # fmt: skip
    dense = estimate(get_model("mistral-7b"), TrainSpec(batch=8, seq=4096)).values
    assert values["params.total"][0] == dense["params.total"]
    assert values["params.total"][1] == 46_702_792_704
    assert np.all(np.diff(values["time_s.step"]) > 0)
    with pytest.raises(SpecError, match=r"experts_per_token must be in 1\.\.n_experts = 4"):
        sweep(get_model("mixtral-8x7b"), quantities=("params.total",),
              n_experts=np.array([4, 8]), experts_per_token=np.array([5, 2]))  # fmt: skip


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"groups_per_token": 0}, "needs expert_groups and groups_per_token"),
        ({"expert_groups": 7, "groups_per_token": 4}, "expert_groups must divide n_experts"),
        ({"expert_groups": 8, "groups_per_token": 9}, "groups_per_token (9) must be <= "),
        ({"expert_groups": 64, "groups_per_token": 1}, "experts_per_token (8) must fit"),
    ],
)
def test_group_limited_routing_is_stated_whole(change, words):
    """DeepSeek-V3's node-limited routing (``n_group`` 8, ``topk_group`` 4 in its config):
    both fields or neither, groups that divide the experts, and room for the k experts."""
    with pytest.raises(SpecError, match=re.escape(words)):
        get_model("deepseek-v3").replace(**change)
    with pytest.raises(SpecError, match="expert_groups needs n_experts >= 1"):
        get_model("llama3-8b").replace(expert_groups=8, groups_per_token=4)


def test_megatrons_combine_keeps_one_copy_of_each_routed_output(monkeypatch):
    """Megatron-Core's unpermute keeps each routed pair's expert output alone (the fused
    top-k kernel saves its input, row map and probabilities; the unfused product its
    expert-output operand), where the reference model's index_add keeps the weighted
    output too: k x act x D bytes per token and MoE layer less. DeepSeek-V2-Lite (k 6,
    D 2,048, 26 MoE layers), one 4,096-token sequence in bf16: 2,617,245,696 bytes."""
    from costmodel.specs.frameworks import MegatronTraits

    ask = dict(hardware="mi355x", gpus=1, framework="megatron", seq=4096, batch=1,
               recompute="none")  # fmt: skip
    one = estimate("deepseek-v2-lite", **ask)["memory_bytes_per_device.activations"]
    monkeypatch.setattr(MegatronTraits, "combine_keeps_weighted", True)
    two = estimate("deepseek-v2-lite", **ask)["memory_bytes_per_device.activations"]
    assert two - one == 6 * 2 * 2048 * 4096 * 26
