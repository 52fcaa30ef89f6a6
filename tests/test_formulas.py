"""Symbolic == exact == lambdified, and the FLOP conventions against hand derivations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from costmodel import TrainSpec, estimate, get_model, quantities, sweep
from costmodel.engine.estimate import exact
from costmodel.symbols import ALL_SYMBOLS

KINDS = {
    "precision": ["fp32", "bf16-mixed", "bf16", "fp8"],
    "attention": ["naive", "flash"],
    "recompute": ["none", "full", "selective", "selective-op"],
}
CONFIGS = [
    (name, dict(zip(KINDS, combo, strict=True)))
    for name in ("cs336-small", "gpt2", "llama3-8b", "xxl")
    for combo in itertools.product(*KINDS.values())
]


@pytest.mark.parametrize(("name", "kinds"), CONFIGS)
def test_scalar_and_vector_evaluation_agree(name, kinds):
    train = TrainSpec(batch=6, seq=256, grad_accum=3, **kinds)
    est = estimate(get_model(name), train)
    grid = sweep(name, batch=np.array([6, 12]), seq=256, grad_accum=3, **kinds)
    for key, value in est.values.items():
        np.testing.assert_allclose(grid[key][0], float(value), rtol=1e-12, err_msg=key)


@pytest.mark.parametrize(("name", "kinds"), CONFIGS[::5])
def test_symbolic_substitution_equals_numbers(name, kinds):
    model, train = get_model(name), TrainSpec(batch=6, seq=256, grad_accum=3, **kinds)
    for key, value in estimate(model, train).values.items():
        reference = exact(model, train, key)
        if isinstance(value, int):
            assert reference == value, key
        else:
            assert float(reference) == pytest.approx(value, rel=1e-12), key


def test_counts_are_python_ints():
    est = estimate(get_model("llama3-405b"), TrainSpec(batch=1024, seq=8192))
    for key in ("params.total", "flops.step", "memory_bytes.activations", "memory_bytes.peak"):
        assert isinstance(est[key], int), key
    # 6 N tokens exceeds int64 here, which is why counts stay Python ints.
    assert est["flops.conventions.six_n"] > 2**63


def test_expressions_use_only_declared_symbols():
    exprs = quantities(get_model("gpt2"), TrainSpec())
    for key, expr in exprs.items():
        assert expr.free_symbols <= set(ALL_SYMBOLS), key


@pytest.mark.parametrize("name", ["cs336-small", "llama3-8b", "gpt2", "xxl"])
def test_activation_breakdown_sums(name):
    v = estimate(get_model(name), TrainSpec(attention="naive")).values
    parts = [k for k in v if k.startswith("memory_bytes.activations_by_op.")]
    assert sum(v[k] for k in parts) == v["memory_bytes.activations"]


def test_backward_is_twice_forward_for_naive_attention():
    # Every counted op is a matmul whose backward is two matmuls of the same size.
    v = estimate(get_model("llama3-8b"), TrainSpec(attention="naive")).values
    assert v["flops.backward"] == 2 * v["flops.forward"]


def test_flash_backward_recomputes_scores():
    # sdpa_backward_flop_count: 5 TxT matmuls in backward vs 2 in forward.
    v = estimate(get_model("cs336-small"), TrainSpec(attention="flash")).values
    core = v["flops.forward_by_op.attn_scores"] + v["flops.forward_by_op.attn_values"]
    assert v["flops.backward"] - 2 * v["flops.forward"] == core // 2


def test_megatron_formula_equals_exact_count_for_gpt_shapes():
    # Narayanan et al. 2021 Eq. 3 assumes MHA, F = 4D and a dense attention backward: for such
    # a model and naive attention without recomputation it is the exact matmul count.
    v = estimate(get_model("gpt2"), TrainSpec(attention="naive")).values
    assert v["flops.conventions.megatron"] == pytest.approx(v["flops.step"], rel=1e-12)


def test_megatron_with_recompute_counts_one_more_forward():
    # 96/72 = 4 passes vs 3; torch skips the last matmul of each block (early stop), so the
    # exact count is lower by one FFN down-projection forward per block.
    model, train = get_model("gpt2"), TrainSpec(attention="naive", recompute="full")
    v = estimate(model, train).values
    w2 = 12 * 2 * 4 * 1024 * 768 * 3072  # L · 2·B·T·D·F
    assert v["flops.conventions.megatron"] == pytest.approx(v["flops.step"] + w2, rel=1e-12)


def test_useful_flops_count_the_causal_triangle():
    # T(T+1)/2 of the T² scores are computed causally: useful = step - 3·core·(T-1)/(2T).
    t = 1024
    v = estimate(get_model("cs336-small"), TrainSpec(seq=t, attention="naive")).values
    core = v["flops.forward_by_op.attn_scores"] + v["flops.forward_by_op.attn_values"]
    assert v["flops.conventions.useful"] == v["flops.step"] - 3 * core * (t - 1) // (2 * t)


def test_six_n_matches_hand_value():
    v = estimate(get_model("cs336-2.7b"), TrainSpec(batch=4, seq=1024)).values
    assert v["flops.conventions.six_n"] == 6 * 3_406_809_600 * 4 * 1024


def test_naive_minus_flash_is_probabilities_plus_mask_minus_logsumexp():
    # Both keep Q, K, V and an attention output of b·T·H·d_h each; naive adds the bf16
    # probabilities (Korthikanti et al. 2022 Eq. 1's 2·a·s²·b term, no dropout) and the
    # T x T bool mask; flash adds the fp32 logsumexp (b·H·T per layer).
    model = get_model("cs336-small")
    naive = estimate(model, TrainSpec(batch=2, seq=512, attention="naive")).values
    flash = estimate(model, TrainSpec(batch=2, seq=512, attention="flash")).values
    layers, b, heads, t = 12, 2, 12, 512
    probs = layers * 2 * b * heads * t * t
    lse = layers * 4 * b * heads * t
    delta = naive["memory_bytes.activations"] - flash["memory_bytes.activations"]
    assert delta == probs + t * t - lse
