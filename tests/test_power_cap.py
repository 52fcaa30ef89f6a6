"""The 96 GB H100 (torchtitan's 500 W parts): its compute rates are the SXM5's times one
sustained-clock ratio, fitted on torchtitan's runs, whose prior (what a fold without those
runs predicts with) is the power cap's own ratio, 500/700 of the SXM5's achieved rates
(``costmodel/catalog/data/fitted.json``, record ``sustained_clock_96gb``)."""

from __future__ import annotations

import pytest

from costmodel import get_hardware
from costmodel.catalog.fitted import fitted


def _power_ratio() -> float:
    capped, sxm = get_hardware("h100-sxm-96gb"), get_hardware("h100-sxm")
    power = capped.power_w / sxm.power_w
    return power * sxm.peak_flops["bf16"] / capped.peak_flops["bf16"]


def test_the_prior_is_the_power_cap_over_the_midpoint_peak():
    (axis,) = fitted()["sustained_clock_96gb"].axes
    assert _power_ratio() == pytest.approx((500 / 700) * (989.4 / 912), rel=1e-12)
    assert axis.prior == pytest.approx(_power_ratio(), abs=1e-6)


def test_the_ratio_scales_every_compute_rate_and_no_memory_rate():
    (axis,) = fitted()["sustained_clock_96gb"].axes
    capped, sxm = get_hardware("h100-sxm-96gb"), get_hardware("h100-sxm")
    for name in ("matmul", "matmul_fp8"):
        assert capped.efficiency[name] == pytest.approx(sxm.efficiency[name] * axis.value)
    for name, rates in sxm.attention_kernels.items():
        for side in ("forward", "backward"):
            want = rates[side] * axis.value
            assert capped.attention_kernels[name][side] == pytest.approx(want)
    assert capped.efficiency["hbm"] == sxm.efficiency["hbm"]
