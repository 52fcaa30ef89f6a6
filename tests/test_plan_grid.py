"""The factored candidate grid: the rules run on its broadcast axes accept exactly the
candidates they accept one row at a time, in the same order, and the helpers it rests on
(``checks.conjunction``, ``sweep.factorize`` of text) are exact."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.engine import threads
from costmodel.engine.grid import AXES, layout_grid
from costmodel.engine.layouts import valid_mask
from costmodel.engine.options import PlanOptions
from costmodel.engine.search import MEMORY, evaluate
from costmodel.engine.sweep import factorize
from costmodel.engine.threads import in_threads
from costmodel.specs.checks import conjunction
from costmodel.specs.model import TrainSpec

CASES = {
    "dense, three batches": ("llama3-8b", "h100-sxm", 96, (384, 480, 576), PlanOptions()),
    "moe, two dispatchers, combined 1F1B": (
        "qwen3-30b-a3b", "b200", 32, (128, 256),
        PlanOptions(frameworks=("megatron", "fsdp2"), dispatchers=("all-to-all", "deepep"),
                    interleave=(2, 1)),
    ),
    "mla moe, three frameworks": (
        "deepseek-v2-lite", "h100-sxm", 16, (64,),
        PlanOptions(frameworks=("megatron", "fsdp2", "deepspeed"), micro_batches=(1, 4, 2)),
    ),
    "tpu": ("llama3-8b", "tpu-v5p", 64, (256,), PlanOptions(frameworks=("fsdp2",))),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_the_grid_keeps_what_the_rules_accept_row_by_row(case):
    name, hw, gpus, batches, options = CASES[case]
    model, hardware = get_model(name), get_hardware(hw)
    train = TrainSpec(batch=batches[0], seq=4096, precision="bf16-mixed")
    grid = layout_grid(model, train, hardware, gpus, options, batches)
    parts = grid.parts(grid.valid(model, train))
    enumerated = 0
    for batch in batches:
        one = layout_grid(model, train.replace(batch=batch), hardware, gpus, options)
        flat = one.rows(one.allowed)  # every candidate, then the rules on each row
        enumerated += len(flat["tp"])
        ok = valid_mask(flat, model, train)
        assert 0 < ok.sum() < len(ok)  # both kinds, so the comparison means something
        assert list(parts[batch]) == list(flat)
        for key, column in flat.items():
            assert np.array_equal(parts[batch][key], column[ok]), (batch, key)
    assert enumerated == len(grid.allowed)


def test_the_grid_orders_candidates_block_by_block_choices_inside():
    model, train = get_model("llama3-8b"), TrainSpec(batch=64, seq=4096)
    grid = layout_grid(model, train, get_hardware("h100-sxm"), 16, PlanOptions())
    rows = grid.rows(grid.allowed)
    assert AXES[-1] == "recompute"  # innermost: consecutive rows differ in recompute first
    assert list(rows["recompute"][:4]) == list(PlanOptions().recompute)
    assert (rows["tp"][:4] == rows["tp"][0]).all()


def test_conjunction_is_the_elementwise_and():
    rng = np.random.default_rng(0)
    shape = (3, 1, 5, 2, 4)
    parts = []
    for _ in range(12):
        axes = rng.random(len(shape)) < 0.5
        sub = tuple(n if keep else 1 for n, keep in zip(shape, axes, strict=True))
        parts.append(rng.random(sub) < 0.9)
    parts.append(np.bool_(True))
    expected = np.logical_and.reduce([np.broadcast_to(p, shape) for p in parts])
    assert np.array_equal(conjunction(parts, shape), expected)
    assert np.array_equal(conjunction([], 4), np.ones(4, bool))


def test_factorize_codes_text_exactly():
    words = np.array(["none", "full", "none", "selective", "full"], dtype="<U16")
    codes, n = factorize(words)
    assert n == 3 and codes.tolist() == [0, 1, 0, 2, 1]
    many = np.array([f"w{i % 40}" for i in range(200)])  # past the words it compares
    codes, n = factorize(many)
    assert len(set(codes.tolist())) == 40 and codes.max() < n
    assert all(codes[i] == codes[i + 40] for i in range(160))


def test_in_threads_keeps_the_order_of_the_items():
    assert list(in_threads(lambda x: x * x, range(50), 3)) == [x * x for x in range(50)]
    assert list(in_threads(lambda x: x, [], 2)) == []


def test_a_sweep_on_two_threads_gives_one_threads_numbers(monkeypatch):
    model, train = get_model("llama3-8b"), TrainSpec(batch=512, seq=4096)
    grid = layout_grid(model, train, get_hardware("h100-sxm"), 256, PlanOptions())
    cols = grid.rows(grid.valid(model, train))
    monkeypatch.setattr(threads, "MIN_POINTS", 1000)  # this sweep's 39,560 use threads
    results = {}
    for workers in (1, 2):
        monkeypatch.setenv("COSTMODEL_WORKERS", str(workers))
        assert threads.threads_for(len(cols["tp"])) == workers
        results[workers] = evaluate(model, train, get_hardware("h100-sxm"), cols, MEMORY)
    for key, values in results[1].items():
        assert np.array_equal(values, results[2][key], equal_nan=True), key
