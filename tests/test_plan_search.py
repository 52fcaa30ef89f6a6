"""The top search (``plan(..., top=k)``, the CLI's; issue 37, item 6): the FLOP/s ceiling
it prunes device counts by holds on every valid layout, its top rows are the whole
search's, memory is priced for every layout and time only where it fits, and asking for
memory alone gives the same bits as asking for everything."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import ModelSpec, TrainSpec, get_hardware, get_model
from costmodel.engine.layouts import device_counts
from costmodel.engine.plan import LAYOUT, PlanOptions, plan
from costmodel.engine.search import (
    MEMORY,
    QUANTITIES,
    TIMES,
    flops_ceiling,
    recomputed_share,
)
from costmodel.engine.sweep import sweep
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import trait

FAST = PlanOptions(recompute=("none", "full"), interleave=(1, 2))

CASES = {  # model, hardware, training, device count: dense, MoE, fp8, long context, TPU
    "dense": ("cs336-small", "h100-sxm", TrainSpec(batch=32, seq=1024), 16),
    "moe": ("mixtral-8x7b", "h100-sxm", TrainSpec(batch=16, seq=4096), 16),
    "fp8": ("llama3-8b", "h100-sxm", TrainSpec(batch=16, seq=4096, precision="fp8"), 8),
    "long": ("llama3-8b", "h100-sxm", TrainSpec(batch=4, seq=32768), 16),
    "tpu": ("llama3-8b", "tpu-v5p", TrainSpec(batch=32, seq=4096), 16),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_valid_layout_runs_faster_than_the_flops_ceiling(case):
    """The bounds' premise, on every valid layout: MFU x peak, times the FLOPs its
    recompute policy re-runs and its pipeline's fill and drain, <= the fastest kernel rate."""
    name, device, train, gpus = CASES[case]
    model, hw = get_model(name), get_hardware(device)
    found = plan(model, train, hw, gpus, FAST)
    assert found.valid > 10
    peak = hw.peak(PRECISIONS[train.precision].peak_dtype)
    cols = found.columns
    redo = np.vectorize(lambda p: recomputed_share(model, train, p))(cols["recompute"])
    bubble = 1 + (cols["pp"] - 1) / (cols["pp_interleave"] * cols["grad_accum"])
    achieved = found.values["mfu"] * peak * (1 + redo) * bubble
    ceiling = flops_ceiling(train, hw)
    assert np.all(achieved <= ceiling * (1 + 1e-12)), (case, achieved.max() / ceiling)
    assert achieved.max() > 0.3 * ceiling  # a bound that means something
    assert (redo > 0.1).any() and (bubble > 1).any()  # both terms are exercised


def test_full_recomputation_re_runs_a_forward_of_the_blocks_but_its_last_matmul():
    """A GPT block (F = 4D, GELU, no biases) runs 24·D² matmul FLOPs a token forward (QKV
    and O 8·D², the FFN 16·D²); full recomputation (torch's checkpoint, stopping early)
    re-runs all but the FFN's down-projection: 16·D². Useful FLOPs a token per layer:
    three times the 24·D², the causal core's 2·D·(T + 1) pairs' FLOPs x 3 and the head's
    2·V·D / L x 3. Selective re-runs only the core, which the bound leaves out."""
    model = ModelSpec(name="gpt", vocab=50304, d_model=2048, n_layers=24, n_heads=16,
                      d_ff=8192, ffn="gelu", norm="layernorm", pos="learned")  # fmt: skip
    train = TrainSpec(batch=8, seq=2048)
    assert recomputed_share(model, train, "none") == 0.0
    assert recomputed_share(model, train, "selective") == 0.0
    d, layers, vocab, t = model.d_model, model.n_layers, model.vocab, train.seq
    useful = 3 * (24 * d * d + 2 * d * (t + 1) + 2 * vocab * d / layers)
    assert recomputed_share(model, train, "full") == pytest.approx(16 * d * d / useful)


@pytest.fixture(scope="module")
def searches():
    model, train = get_model("llama3-8b"), TrainSpec(batch=256, seq=4096)
    hw, counts = get_hardware("h100-sxm"), device_counts(64, 8)
    options = PlanOptions(recompute=("none", "selective", "full"), interleave=(1,))
    whole = plan(model, train, hw, counts, options)
    return whole, plan(model, train, hw, counts, options, top=5)


def test_the_top_search_skips_counts_and_keeps_the_whole_searchs_top_rows(searches):
    whole, top = searches
    assert top.skipped and set(top.skipped) < set(device_counts(64, 8))
    assert top.enumerated < whole.enumerated and top.valid < whole.valid
    assert int(top.fits.sum()) < int(whole.fits.sum())
    for mine, theirs in zip(top.top(5), whole.top(5), strict=True):
        assert {k: mine[k] for k in LAYOUT} == {k: theirs[k] for k in LAYOUT}
        for key in QUANTITIES:
            assert mine[key] == theirs[key], key
    # every skipped count is below the fifth row over the ceiling it was pruned by
    fifth = whole.top(5)[-1]["tokens_per_s"]
    assert all(
        whole.values["tokens_per_s"][whole.fits & (whole.columns["gpus"] == c)].max() < fifth
        for c in top.skipped
        if (whole.fits & (whole.columns["gpus"] == c)).any()
    )


def test_the_top_search_times_only_what_fits():
    """One device cannot hold Llama-3-8B's state: that count keeps its smallest peak (what a
    no-fit answer names), without a time; what fits on 8 is timed. Ranked per device,
    nothing is pruned."""
    options = PlanOptions(recompute=("none", "full"), interleave=(1,), objective="tokens-per-gpu")
    top = plan(get_model("llama3-8b"), TrainSpec(batch=16, seq=4096), get_hardware("h100-sxm"),
               [1, 8], options, top=3)  # fmt: skip
    one = top.columns["gpus"] == 1
    assert one.sum() == 1 and not top.fits[one].any() and not top.skipped
    assert np.isnan(top.values["time_s.step"][~top.fits]).all()
    assert np.isfinite(top.values["time_s.step"][top.fits]).all() and top.fits.sum() > 3
    assert np.isfinite(top.values["memory_bytes_per_device.peak"]).all()


def test_asking_for_memory_alone_gives_the_same_bits_as_asking_for_everything():
    cols = {"tp": np.array([1, 2, 4, 8]), "pp": np.array([1, 2, 2, 1]),
            "fsdp": np.array([8, 2, 1, 1]), "micro_batch": np.array([1, 2, 1, 4])}  # fmt: skip
    fields = dict(hardware="h100-sxm", batch=32, seq=2048, framework="fsdp2", **cols)
    cut = sweep("llama3-8b", quantities=MEMORY, **fields)
    whole = sweep("llama3-8b", quantities=QUANTITIES, **fields)
    assert set(cut) == set(MEMORY) and not set(cut) & set(TIMES)
    for key in MEMORY:
        assert np.array_equal(cut[key], whole[key]), key


def test_a_mutable_framework_column_is_compared_afresh():
    names = np.array(["fsdp2", "megatron"], dtype=object)
    assert trait(names, "combined_1f1b").tolist() == [False, True]
    names[0] = "megatron"  # a writable array may change between calls: never reused
    assert trait(names, "combined_1f1b").tolist() == [True, True]
    frozen = np.array(["megatron", "fsdp2"], dtype=object)
    frozen.flags.writeable = False
    assert trait(frozen, "combined_1f1b").tolist() == [True, False]
    assert trait(frozen, "combined_1f1b").tolist() == [True, False]


def test_plan_refuses_a_bad_top():
    from costmodel.specs.checks import SpecError

    with pytest.raises(SpecError, match="top"):
        plan(get_model("cs336-small"), TrainSpec(batch=8, seq=512), get_hardware("h100-sxm"), 8,
             top=0)  # fmt: skip
