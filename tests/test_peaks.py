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
