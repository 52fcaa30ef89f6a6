"""Peak-memory estimates against the high-water mark of live tensor bytes.

``validate.probes.accounting.measure_peaks`` tracks every storage torch allocates (a
fragmentation-free allocator) through a forward, a backward and two AdamW steps on the
``meta`` device. The estimates model the live set at the worst moments but not the exact
order of frees, so they are not exact: the tolerance is 10 % (issue 4's peak-memory target).
Measured worst case over the slow grid below: +6.7 % (forward), -5.9 % (forward+backward),
+1.3 % (step).
"""

from __future__ import annotations

import itertools

import pytest

from costmodel import TrainSpec, estimate, get_model
from validate.probes.accounting import measure_peaks

TOLERANCE = 0.10
KINDS = list(
    itertools.product(
        ["fp32", "bf16-mixed", "bf16"],
        ["naive", "flash"],
        ["none", "full", "selective", "selective-op"],
    )
)


def check(model, train):
    measured = measure_peaks(model, train)
    est = estimate(model, train)
    for key, value in measured.items():
        predicted = est[f"memory_bytes.{key}"]
        assert abs(predicted - value) <= TOLERANCE * value, (key, predicted, value)


@pytest.mark.parametrize("name", ["cs336-small", "gpt2", "llama3-8b", "xxl"])
@pytest.mark.parametrize(
    ("precision", "attention", "recompute"),
    [k for k in KINDS if k[0] != "bf16" and k[2] != "selective"],
)
def test_peaks_two_layers(name, precision, attention, recompute):
    check(
        get_model(name, n_layers=2),
        TrainSpec(batch=2, seq=128, precision=precision, attention=attention, recompute=recompute),
    )


@pytest.mark.parametrize("name", ["cs336-small", "llama3-8b"])
@pytest.mark.parametrize(("precision", "recompute"), [("bf16-mixed", "none"), ("fp32", "full")])
def test_peaks_with_gradient_accumulation(name, precision, recompute):
    """From the second micro-batch on, the first one's gradients are alive through forward
    and backward (they were missing: forward+backward -18 % to -32 %, step to -16 %). Not
    modelled: the new gradient of a weight beside its accumulated .grad (Llama-3-8B's
    fp32 head: forward+backward -11 % at seq 256, -7 % at 512)."""
    check(
        get_model(name, n_layers=2),
        TrainSpec(batch=4, seq=512, grad_accum=2, precision=precision, recompute=recompute),
    )


def test_step_never_peaks_below_its_forward():
    """Found by fuzzing: under full recomputation a block's weight casts make the forward's
    transient larger than backward's when the vocabulary is small (vocab 256, naive cores)."""
    model = get_model("cs336-small", vocab=256)
    for recompute in ("none", "full"):
        train = TrainSpec(batch=1, seq=2048, attention="naive", recompute=recompute)
        est = estimate(model, train)
        forward = est["memory_bytes.peak_forward"]
        assert est["memory_bytes.peak_forward_backward"] >= forward
        assert est["memory_bytes.peak"] >= forward


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama3-8b", "mistral-7b", "xxl", "cs336-2.7b"])
@pytest.mark.parametrize(("batch", "seq"), [(1, 512), (4, 128)])
def test_peaks_grid(name, batch, seq):
    for precision, attention, recompute in KINDS:
        check(
            get_model(name, n_layers=2),
            TrainSpec(
                batch=batch, seq=seq, precision=precision, attention=attention, recompute=recompute
            ),
        )


@pytest.mark.slow
def test_peaks_full_depth():
    for precision, attention, recompute in KINDS:
        check(
            get_model("cs336-small"),
            TrainSpec(
                batch=1, seq=512, precision=precision, attention=attention, recompute=recompute
            ),
        )
