"""Parallel attention + FFN blocks (GPT-J; PaLM, Chowdhery et al. 2022, Sec. 2; Falcon;
MaxText's 2023 decoder): one norm per block whose output both branches read, the branches'
outputs summed into the residual stream. Counted exactly against the reference model, and
one tensor-parallel reduction per block."""

from __future__ import annotations

import pytest

from costmodel import ModelSpec, ParallelSpec, TrainSpec, estimate, get_hardware
from costmodel.specs.checks import SpecError
from validate.probes.accounting import compare

SMALL = ModelSpec(vocab=128, d_model=64, n_layers=2, n_heads=4, d_ff=96, max_positions=64,
                  parallel_block=True)  # fmt: skip


@pytest.mark.parametrize(
    ("attention", "recompute", "precision", "dropout"),
    [("flash", "none", "fp32", 0.0), ("naive", "selective", "fp32", 0.1),
     ("flash", "full", "bf16-mixed", 0.0), ("naive", "none", "bf16-mixed", 0.1)],
)  # fmt: skip
def test_a_parallel_block_is_exact(attention, recompute, precision, dropout):
    """Parameters, FLOPs, kept bytes and weight casts equal what torch counts on CPU."""
    for spec in (SMALL, SMALL.replace(norm="layernorm", bias=True, pos="learned")):
        train = TrainSpec(batch=2, seq=32, attention=attention, recompute=recompute,
                          precision=precision, dropout=dropout)  # fmt: skip
        rows = compare(spec, train, device="cpu")
        assert [r for r in rows if r["predicted"] != r["measured"]] == []


def test_one_norm_per_block_and_the_normed_input_kept_once():
    """Against the same sizes in sequence: L x D fewer norm gains (RMSNorm), and per block
    the second norm's input and statistic and the FFN's own copy of its input not kept."""
    train = TrainSpec(batch=2, seq=32, precision="fp32")
    side, chain = (estimate(m, train) for m in (SMALL, SMALL.replace(parallel_block=False)))
    assert chain["params.norms"] - side["params.norms"] == 2 * 64
    assert chain["flops.forward"] == side["flops.forward"]
    kept = chain["memory_bytes.activations"] - side["memory_bytes.activations"]
    assert kept == 2 * 2 * 32 * (4 * 64 + 4 + 4 * 64)  # norm input + rstd, FFN input, fp32


def test_one_tensor_parallel_reduction_per_block():
    """Megatron-style tp: the branches' summed output is reduced once (and the one normed
    input gathered once under sequence parallelism): a block moves half the sequential
    block's all-reduce bytes, m·L·(2(Y-1)/Y)·a·b·T·D fewer each way (and half that again
    of the input shards Megatron gathers once more in backward)."""
    hw = get_hardware("h100-sxm")
    train = TrainSpec(batch=8, seq=256, grad_accum=1)
    par = ParallelSpec(tp=2, dp=4, sequence_parallel=True, framework="megatron")
    side, chain = (estimate(m.replace(vocab=32000, d_model=1024, n_heads=8, d_ff=4096), train,
                            par, hw)["comm_bytes.tp"] for m in (SMALL, SMALL.replace(
                                parallel_block=False)))  # fmt: skip
    assert chain - side == 2 * 5 * 1 * 2 * 512 * 1024 // 2  # L, 1 + 3/2, bus 1, bf16, b·T, D


@pytest.mark.parametrize(
    ("spec", "train", "field"),
    [({}, {"elementwise": "eager"}, "elementwise"),
     ({}, {"recompute": "selective-op"}, "recompute"),
     ({"ffn_only": True, "vocab": 0}, {}, "parallel_block"),
     ({"kv_lora_rank": 16, "rope_head_dim": 8}, {}, "parallel_block")],
)  # fmt: skip
def test_what_is_not_modelled_is_refused(spec, train, field):
    with pytest.raises(SpecError) as err:
        estimate(SMALL.replace(**spec), TrainSpec(batch=2, seq=32, **train))
    assert err.value.field == field
