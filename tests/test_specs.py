"""Spec validation: every bad value is a ValueError naming the field and the constraint."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import ModelSpec, TrainSpec, estimate, get_model

BASE = {"vocab": 100, "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 0}, "d_model must be >= 1 (got 0)"),
        ({"n_layers": -3}, "n_layers must be >= 1 (got -3)"),
        ({"n_heads": 3}, "n_heads must divide d_model"),
        ({"n_kv_heads": 3}, "n_kv_heads must divide n_heads (got n_heads=4, n_kv_heads=3)"),
        ({"ffn": "geglu"}, "ffn must be one of swiglu, gelu, relu (got 'geglu')"),
        ({"norm": "batchnorm"}, "norm must be one of rmsnorm, layernorm"),
        ({"pos": "alibi"}, "pos must be one of rope, learned"),
        ({"bias": "yes"}, "bias must be true or false"),
        ({"d_ff": 2.5}, "d_ff must be an integer (got 2.5)"),
        ({"vocab": 0}, "vocab must be >= 1 (got 0)"),
        ({"ffn_only": True}, "vocab must be 0 for an ffn_only model (got 100)"),
        ({"head_dim": 7}, "head_dim must be even for rope (got 7)"),
    ],
)
def test_bad_model_fields(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelSpec(**{**BASE, **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch": 0}, "batch must be >= 1"),
        ({"seq": True}, "seq must be an integer"),
        ({"precision": "fp4"}, "precision must be one of"),
        ({"optimizer": "lion"}, "optimizer must be one of"),
        ({"attention": "ring"}, "attention must be one of naive, flash"),
        ({"dropout": -0.1}, r"dropout must be >= 0 \(got -0.1\)"),
        ({"dropout": 1.0}, r"dropout must be below 1 \(got 1.0\)"),
        ({"recompute": "some"}, "recompute must be one of none, full, selective, selective-op"),
        ({"batch": 6, "grad_accum": 4}, "grad_accum must divide batch"),
    ],
)
def test_bad_train_fields(changes, message):
    with pytest.raises(ValueError, match=message):
        TrainSpec(**changes)


def test_specs_are_frozen_and_keyword_only():
    spec = ModelSpec(**BASE)
    with pytest.raises(AttributeError):
        spec.d_model = 128  # type: ignore[misc]
    with pytest.raises(TypeError):
        ModelSpec(100, 64, 2, 4, 256)  # type: ignore[misc]


def test_replace_rederives_defaults_and_rejects_unknown_fields():
    spec = get_model("cs336-small")
    wider = spec.replace(d_model=1024, n_heads=16)
    assert wider.head_dim == 64 and wider.n_kv_heads == 16
    assert get_model("llama3-8b").replace(n_layers=2).n_kv_heads == 8
    with pytest.raises(ValueError, match="unknown ModelSpec field"):
        spec.replace(width=3)
    with pytest.raises(ValueError, match="model must be one of"):
        get_model("gpt5")


def test_learned_positions_bound_the_sequence():
    with pytest.raises(ValueError, match="seq must be <= max_positions"):
        estimate(get_model("gpt2"), TrainSpec(seq=2048))


@settings(max_examples=60, deadline=None)
@given(
    heads=st.sampled_from([1, 2, 4, 8]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 16, 64]),
    layers=st.integers(1, 64),
    d_ff=st.integers(1, 10_000),
    vocab=st.integers(1, 200_000),
    ffn=st.sampled_from(["swiglu", "gelu", "relu"]),
    tied=st.booleans(),
    batch=st.integers(1, 64),
    seq=st.integers(1, 8192),
    attention=st.sampled_from(["naive", "flash"]),
    recompute=st.sampled_from(["none", "full", "selective", "selective-op"]),
)
def test_any_valid_spec_gives_consistent_numbers(
    heads, group, head_dim, layers, d_ff, vocab, ffn, tied, batch, seq, attention, recompute
):
    kv = max(1, heads // group)
    model = ModelSpec(
        vocab=vocab,
        d_model=heads * head_dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv,
        d_ff=d_ff,
        ffn=ffn,
        tied=tied,
    )
    v = estimate(
        model, TrainSpec(batch=batch, seq=seq, attention=attention, recompute=recompute)
    ).values
    assert all(x >= 0 for x in v.values())
    parts = [k for k in v if k.startswith("memory_bytes.activations_by_op.")]
    assert sum(v[k] for k in parts) == v["memory_bytes.activations"]
    assert v["flops.step"] == v["flops.forward"] + v["flops.backward"]
    assert v["flops.backward"] >= 2 * v["flops.forward"]
    assert v["memory_bytes.peak"] >= v["memory_bytes.peak_forward_backward"]
    assert v["memory_bytes.peak_forward_backward"] >= v["memory_bytes.activations"]


def test_a_batch_past_any_run_is_a_typo_named_by_its_flag(capsys):
    """Issue 60's fourth probe: ``plan --global-batch 99999999999`` ranked layouts of
    216-year steps. A step holds at most 2^24 sequences (thousands of times any published
    run's) in the specs, the sweeps, plan and estimate alike."""
    from costmodel.cli import main
    from costmodel.specs.checks import SpecError
    from costmodel.specs.rules import MAX_BATCH

    with pytest.raises(SpecError, match="batch must be <= 16,777,216 sequences a step"):
        TrainSpec(batch=MAX_BATCH * 2, seq=128)
    assert TrainSpec(batch=MAX_BATCH, seq=128, grad_accum=MAX_BATCH).batch == MAX_BATCH
    base = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--seq", "4096"]
    for argv in (["plan", *base, "--gpus", "8", "--global-batch", "99999999999"],
                 ["estimate", *base, "--gpus", "8", "--batch", "99999999999"]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "must be <= 16,777,216 sequences a step" in err and err.count("\n") == 1, err
