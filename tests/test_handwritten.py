"""costmodel's rule for the hand-written FSDP (framework="handwritten", validate/fsdp.py):
closed forms by hand and the spec's limits. Measured against real ranks in
tests/test_rank_memory.py (layout fsdp-by-hand) and tests/test_dist_suites.py (bytes)."""

from __future__ import annotations

import math

import pytest

from costmodel import ParallelSpec, SpecError, TrainSpec, estimate, get_hardware
from validate.distributed.checks import small_spec

HW = get_hardware("h100-sxm")


def _values(world: int, precision: str = "fp32", **model) -> dict[str, float]:
    spec = small_spec().replace(**model)
    par = ParallelSpec(fsdp=world, framework="handwritten")
    return estimate(spec, TrainSpec(batch=world, seq=64, precision=precision), par, HW).values


def test_state_pads_each_matrix_and_replicates_the_norms() -> None:
    """Over 3 ranks: every matrix's elements rounded up to a multiple of 3 one by one (a
    sum rounded once would undercount), the 2L + 1 RMSNorm gains whole."""
    spec = small_spec().replace(d_model=136, d_ff=260, vocab=257)
    d, f, v, L = spec.d_model, spec.d_ff, spec.vocab, spec.n_layers
    world = 3
    assert sum(math.ceil(n / world) for n in (v * d, d * d, d * f)) * world > v * d + d * d + d * f
    mats = [v * d, v * d] + L * ([d * d] * 4 + [d * f] * 3)  # embedding, head; q k v o, FFN
    shard = sum(math.ceil(n / world) for n in mats)
    norms = (2 * L + 1) * d
    values = _values(world, vocab=257, d_model=136, d_ff=260)
    assert values["memory_bytes_per_device.master"] == 4 * (shard + norms)
    assert values["memory_bytes_per_device.grads"] == 4 * (shard + norms)
    assert values["memory_bytes_per_device.optimizer"] == 8 * (shard + norms)
    # one matrix gathered at a time, padded: the largest, an FFN matrix here (d_ff > vocab)
    largest = max(world * math.ceil(n / world) for n in mats)
    assert largest == world * math.ceil(d * f / world)
    assert values["memory_bytes_per_device.params"] == 4 * largest


def test_fp32_shards_whatever_the_compute_dtype() -> None:
    mixed, fp32 = _values(2, "bf16-mixed"), _values(2)
    for q in ("master", "grads", "optimizer"):
        key = f"memory_bytes_per_device.{q}"
        assert mixed[key] == fp32[key], q
    key = "memory_bytes_per_device.params"
    assert mixed[key] * 2 == fp32[key]  # gathered in the compute dtype


def test_bytes_sent_by_hand() -> None:
    """Per step on 2 ranks, fp32: every matrix gathered in forward, all but the embedding
    again in backward, every gradient reduce-scattered, the norm gains all-reduced."""
    spec = small_spec()
    d, f, v, L = spec.d_model, spec.d_ff, spec.vocab, spec.n_layers
    mats = 2 * v * d + L * (4 * d * d + 3 * d * f)
    half = 4 * mats / 2  # (N-1)/N of each full fp32 tensor
    gathers = half + (half - 4 * v * d / 2)
    norms = 2 * (2 - 1) / 2 * 4 * (2 * L + 1) * d
    assert _values(2)["comm_bytes.fsdp"] == gathers + half + norms


def test_its_communication_is_exposed() -> None:
    """Nothing is prefetched: the fsdp group's time adds to compute in each phase."""
    v = _values(2)
    for phase in ("forward", "backward"):
        assert v[f"time_s.{phase}"] == pytest.approx(
            v[f"time_s.compute_{phase}"] + v[f"comm_phase_s.fsdp.{phase}"]
        )


@pytest.mark.parametrize(
    ("parallel", "train", "field"),
    [
        ({"fsdp": 2, "tp": 2}, {}, "tp"),
        ({"fsdp": 2, "dp": 2}, {}, "dp"),
        ({"fsdp": 2, "zero": 2}, {}, "zero"),
        ({"fsdp": 2}, {"recompute": "full"}, "recompute"),
    ],
)
def test_what_it_does_not_run_is_refused(parallel: dict, train: dict, field: str) -> None:
    par = ParallelSpec(framework="handwritten", **parallel)
    with pytest.raises(SpecError) as err:
        estimate(small_spec(), TrainSpec(batch=4, seq=64, **train), par, HW)
    assert err.value.field == field
    assert "handwritten" in str(err.value)


def test_a_tied_head_is_refused() -> None:
    par = ParallelSpec(fsdp=2, framework="handwritten")
    with pytest.raises(SpecError, match="tied"):
        estimate(small_spec().replace(tied=True), TrainSpec(batch=2, seq=64), par, HW)


def test_gradient_preparation_is_charged_to_backward() -> None:
    """fp32, so nothing else differs from the reference framework's ZeRO-3: backward's
    compute grows by 12 bytes per weight element (zero fill: write 4; copy: read 4, write
    4; no cast in fp32) over the device's achieved HBM bandwidth; forward does not."""
    spec, train = small_spec(), TrainSpec(batch=2, seq=64, precision="fp32")
    hand = estimate(spec, train, ParallelSpec(fsdp=2, framework="handwritten"), HW).values
    zero3 = estimate(spec, train, ParallelSpec(fsdp=2), HW).values
    d, f, v, L = spec.d_model, spec.d_ff, spec.vocab, spec.n_layers
    elements = 2 * v * d + L * (4 * d * d + 3 * d * f)  # even sizes: no padding
    extra = hand["time_s.compute_backward"] - zero3["time_s.compute_backward"]
    assert extra == pytest.approx(12 * elements / HW.hbm_bandwidth(), rel=1e-9)
    assert hand["time_s.compute_forward"] == pytest.approx(zero3["time_s.compute_forward"])
