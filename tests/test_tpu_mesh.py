"""TPU meshes: ICI inside a slice over the torus axes a group spans (the Scaling Book's
M_X, M_Y), the data-center network between slices (MaxText's ``num_slices``), and a
layout's slices refused with the field where they cannot be."""

from __future__ import annotations

import pytest

from costmodel import TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.parallel.layout import group_links
from costmodel.specs.checks import SpecError
from costmodel.specs.parallel import ParallelSpec


def test_tpu_groups_inside_a_slice_use_ici_and_across_slices_dcn():
    v5p = get_hardware("tpu-v5p")  # 6.25e9 B/s of DCN per chip (a 4-chip host's 2.5e10)
    one = group_links(ParallelSpec(dp=2, fsdp=64, mx=3), v5p)
    assert one["dp"][0] == pytest.approx(3 * 1.8e11 * 0.9)  # one slice of 128: all ICI
    two = group_links(ParallelSpec(dp=2, fsdp=64, mx=3, slices=2), v5p)
    assert two["fsdp"][0] == pytest.approx(3 * 1.8e11 * 0.9)  # inside a slice of 64
    # one dp member per slice: each chip's pair is in the other slice, over its own share
    assert two["dp"][0] == pytest.approx(6.25e9 * 0.8)
    assert two["dp"][1] == v5p.network_latency_s
    # dp 4 over 2 slices: 2 members per slice send through two hosts' NICs at once
    wide = group_links(ParallelSpec(dp=4, fsdp=32, mx=3, slices=2), v5p)
    assert wide["dp"][0] == pytest.approx(2 * 6.25e9 * 0.8)


@pytest.mark.parametrize(
    ("par", "hw", "message"),
    [
        (dict(fsdp=8, slices=3), "tpu-v5p", "slices must divide the device count"),
        (dict(fsdp=8, slices=2), "h100-sxm", "slices > 1 joins TPU slices over DCN"),
    ],
)
def test_slices_are_refused_naming_the_field(par, hw, message):
    with pytest.raises(SpecError, match=message) as err:
        estimate(get_model("llama3-8b"), TrainSpec(batch=8, seq=1024), ParallelSpec(**par),
                 get_hardware(hw))  # fmt: skip
    assert err.value.field == "slices"
