"""The Python API's answers to the questions issue 60's fifth and sixth probes asked: formulas
and their derivatives, a plan over a range, fit's inputs, min_fsdp's, the repr of a token
budget."""

from __future__ import annotations

import pytest

import costmodel as cm
from costmodel.specs.checks import SpecError


def test_a_derivative_sympy_cannot_take_is_one_line_not_a_type_error():
    """Issue 60's API probe: python.md's ``sp.diff(step, T)`` evaluated to a raw sympy
    TypeError (the ceilings of the GEMM tiles leave Derivative objects); a smooth quantity's
    derivative evaluates."""
    import sympy as sp

    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, seq=8192, batch=64,
                      framework="fsdp2")  # fmt: skip
    T = cm.symbol("T")
    with pytest.raises(cm.SpecError, match="difference two estimates") as err:
        est.evaluate(sp.diff(est.expr("time_s.step"), T))
    assert err.value.field == "expr"
    per_token = est.evaluate(sp.diff(est.expr("flops.step"), T))
    ahead = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, seq=8193, batch=64,
                        framework="fsdp2")  # fmt: skip
    assert per_token == pytest.approx(ahead["flops.step"] - est["flops.step"], rel=1e-3)


def test_a_plan_over_a_batch_range_or_gpu_counts_says_each_rows_own():
    """Issue 60's API probe: over ``batch=(32, 64)`` the repr's header said batch 64 while
    rows ran 64, 60, 56 and 48 (a faster step looked better), and under ``max_gpus`` the
    rows left out their GPU counts."""
    ranged = cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=(32, 64), seq=8192)
    text = repr(ranged)
    assert "batch 48..64 x seq 8192" in text
    for row in ranged.top(5):
        assert f"ga{row['grad_accum']} {row['recompute']}: batch {row['batch']:,}, step" in text
    counts = cm.plan("llama3-8b", hardware="h100-sxm", max_gpus=64, batch=64, seq=4096)
    assert ": 64 GPUs, step" in repr(counts) and "batch 64, step" not in repr(counts)


def test_a_plans_microbatches_error_names_the_argument():
    """Issue 60's API probe: ``microbatches=[0]`` was refused as ``micro_batches``."""
    with pytest.raises(cm.SpecError, match="microbatches must be >= 1") as err:
        cm.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=4096, microbatches=[0])
    assert err.value.field == "microbatches"


def test_fit_refuses_a_headroom_beside_a_budget():
    """Issue 60's API probe: ``fit(headroom=0.5, budget=60e9)`` let the budget win silently,
    where max_seq and max_batch refuse the pair."""
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=4096)
    with pytest.raises(cm.SpecError, match="give headroom or budget, not both") as err:
        est.fit(headroom=0.5, budget=60e9)
    assert err.value.field == "budget" and est.fit(budget=60e9).budget_bytes == 60e9


def test_min_fsdp_without_hardware_names_hardware():
    """Issue 60's sixth probe: min_fsdp without hardware said "hardware is required with
    microbatch" (never given)."""
    with pytest.raises(cm.SpecError, match="min_fsdp needs hardware") as err:
        cm.min_fsdp("llama3-8b", seq=4096)
    assert err.value.field == "hardware"


def test_the_repr_says_the_training_days_and_cost_of_a_token_budget():
    """Issue 60's sixth probe: with token_budget and price_per_hour the repr left out the
    days and the cost the CLI prints."""
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=64, batch=512, seq=8192,
                      framework="fsdp2", token_budget=1e12, price_per_hour=2.5)  # fmt: skip
    assert f"training: {est['train_days']:,.2f} days, ${est['train_cost']:,.0f}" in repr(est)


def test_plan_takes_the_batch_in_tokens_as_the_cli_does():
    """A probe: the CLI's --global-batch-tokens had no API twin. ``batch_tokens`` is it:
    the same search as the batch in sequences, its errors named by its Python name."""
    import costmodel

    by_tokens = costmodel.plan("llama3-8b", hardware="h100-sxm", gpus=8, seq=4096,
                               batch_tokens=64 * 4096)  # fmt: skip
    by_seqs = costmodel.plan("llama3-8b", hardware="h100-sxm", gpus=8, seq=4096, batch=64)
    assert by_tokens.summary(3) == by_seqs.summary(3)
    with pytest.raises(SpecError, match="batch_tokens must be a multiple of seq"):
        costmodel.plan("llama3-8b", hardware="h100-sxm", gpus=8, seq=4096, batch_tokens=1000)
    with pytest.raises(SpecError, match=r"give batch .* or batch_tokens, not both"):
        costmodel.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=8, batch_tokens=4096)
