"""Full recomputation of every n-th block (``TrainSpec.recompute_every``: torchtitan's
``selective_ac_option = "n"``, IBM's fms-fsdp ``selective_checkpointing``): ceil(L/n)
blocks keep their input and re-run their forward, the others keep what they keep without
checkpointing. Counted exactly against the reference model, which checkpoints the blocks
whose index is a multiple of n."""

from __future__ import annotations

import pytest

from costmodel import ModelSpec, ParallelSpec, TrainSpec, estimate, get_hardware, get_model
from costmodel.specs.checks import SpecError
from validate.probes.accounting import compare

SMALL = ModelSpec(vocab=128, d_model=64, n_layers=3, n_heads=4, d_ff=96, max_positions=64)


@pytest.mark.parametrize("every", [2, 3])
@pytest.mark.parametrize(
    ("attention", "precision", "dropout"),
    [("flash", "fp32", 0.0), ("naive", "bf16-mixed", 0.1), ("flash", "bf16-mixed", 0.0)],
)
def test_every_nth_block_is_exact(every, attention, precision, dropout):
    """Parameters, FLOPs (the recomputed forward of ceil(3/n) blocks), kept bytes and the
    weight casts kept for the blocks not checkpointed equal what torch counts on CPU."""
    train = TrainSpec(batch=2, seq=32, attention=attention, precision=precision,
                      recompute="full", recompute_every=every, dropout=dropout)  # fmt: skip
    rows = compare(SMALL, train, device="cpu")
    assert [r for r in rows if r["predicted"] != r["measured"]] == []


def test_it_lies_between_none_and_full():
    """Llama-2-7B on 128 A100s: checkpointing every 2nd of 32 blocks re-runs half the full
    policy's FLOPs, and time and memory fall between no and full recomputation."""
    model, hw = get_model("llama2-7b"), get_hardware("a100-80gb")
    par = ParallelSpec(fsdp=128, framework="fsdp2")
    est = {
        name: estimate(model, TrainSpec(batch=256, seq=4096, grad_accum=1, **kw), par, hw)
        for name, kw in (("none", {}), ("full", {"recompute": "full"}),
                         ("half", {"recompute": "full", "recompute_every": 2}))
    }  # fmt: skip
    assert 2 * est["half"]["flops.recompute"] == est["full"]["flops.recompute"]
    for key in ("time_s.step", "memory_bytes_per_device.activations"):
        low, high = sorted((est["none"][key], est["full"][key]))
        assert low < est["half"][key] < high, key


@pytest.mark.parametrize(
    ("spec", "train", "message"),
    [({}, {"recompute": "none", "recompute_every": 2}, "needs recompute=full"),
     ({"ffn_only": True, "vocab": 0}, {"recompute": "full", "recompute_every": 2},
      "ffn_only"),
     ({}, {"recompute": "full", "recompute_every": 2, "finetune": "lora"}, "finetune"),
     ({}, {"recompute": "full", "recompute_every": 0}, "recompute_every")],
)  # fmt: skip
def test_what_is_not_modelled_is_refused(spec, train, message):
    with pytest.raises(SpecError, match=message) as err:
        estimate(SMALL.replace(**spec), TrainSpec(batch=2, seq=32, **train))
    assert err.value.field == "recompute_every"
