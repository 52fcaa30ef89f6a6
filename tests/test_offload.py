"""The offload planner: per-block bytes and re-run FLOPs by hand, the phase-time rule by hand,
monotonicity in budgets and bandwidth, the published Llama-3-8B plan, and bad input."""

from __future__ import annotations

import json

import pytest

from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.cli import main
from costmodel.engine.estimate import estimate
from costmodel.engine.offload import LINKS, OffloadSpec, evaluate_plan, plan_offload
from costmodel.engine.offload_terms import block_terms
from costmodel.single.offload import recompute_flops_per_token, saved_bytes_per_token
from costmodel.specs.checks import SpecError
from costmodel.specs.model import TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols import values_for

H100 = get_hardware("h100-sxm")
LLAMA = get_model("llama3-8b")
PURE_BF16 = TrainSpec(batch=68, seq=8192, precision="bf16")
PROFILE = OffloadSpec(device_budget=30e9, host_budget=70e9, link_bw=LINKS["pcie5"][0],
                      optimizer_state="nvme")  # fmt: skip
# The published plan (issue 17): 16,384-token chunks of 2 sequences, 34 rounds; 5 parameter
# and 4 gradient blocks on the device (here 3 and 2 pinned plus two streaming buffers each),
# 5 activation slots; on the host 6 blocks saved fully and 21 as input + context + attention.
PUBLISHED = {"chunk": 16384, "seqs_per_round": 2, "pinned_params": 3, "pinned_grads": 2,
             "device_units": 5, "full": 6, "attn": 21}  # fmt: skip


def _per_token(exprs, train):
    v = values_for(LLAMA, train)
    return {k: int(e.subs(v)) for k, e in exprs.items()}


def test_saved_bytes_per_token_by_hand():
    # pure bf16, flash, Llama-3-8B (D 4096, F 14336, H 32, K 8, d_h 128), per block:
    # two norm inputs 2D + 4 B rstd each, attention and FFN inputs 2D each, Q 2·H·d_h,
    # K and V 2·2·K·d_h, O 2·H·d_h and fp32 logsumexp 4·H, SwiGLU hidden (3·2 + 2)·F.
    full = 2 * (2 * 4096 + 4) + 2 * 2 * 4096 + (8192 + 4096 + 8192 + 128) + 8 * 14336
    got = _per_token(saved_bytes_per_token(LLAMA, PURE_BF16), PURE_BF16)
    assert got == {"full": full, "attn": 8192 + 4096 + 8192 + 128, "ctx": 8192 + 4096}
    mixed = TrainSpec(seq=8192, precision="bf16-mixed")  # autocast: fp32 residual and norms
    got = _per_token(saved_bytes_per_token(LLAMA, mixed), mixed)
    assert got["full"] == full + 2 * 2 * 4096 and got["attn"] == 16384 + 4096 + 8192 + 128


def test_recompute_flops_per_token_by_hand():
    # Q and O projections 2·D·H·d_h each; gate and up of SwiGLU 2·D·F each; QK^T and PV
    # over T = 8192 keys 2·H·T·d_h each (dense).
    attn = 2 * 2 * 4096 * 4096 + 2 * 2 * 4096 * 14336
    got = _per_token(recompute_flops_per_token(LLAMA, PURE_BF16), PURE_BF16)
    assert got == {"full": 0, "attn": attn, "ctx": attn + 2 * 2 * 32 * 8192 * 128}


def test_phase_time_rule_by_hand():
    """Everything streamed and saved fully on the host: each phase is the longer of compute
    and the busier link direction (overlap 1), or their sum (overlap 0)."""
    for overlap in (1.0, 0.0):
        spec = OffloadSpec(device_budget=1e12, host_budget=1e13, link_bw=20e9, overlap=overlap)
        t = block_terms(LLAMA, PURE_BF16, H100, spec, 8192, 1)
        v = t.evaluate(0, 0, t.units, 0, spec, G=0)
        L, X = t.layers, t.unit["full"]
        fwd_xfer = max(L * t.param_block, L * X) / 20e9
        bwd_xfer = max(L * t.param_block + L * X, L * t.grad_block) / 20e9
        combine = (lambda c, x: max(c, x)) if overlap else (lambda c, x: c + x)
        assert v["forward"] == pytest.approx(combine(t.forward_s, fwd_xfer), rel=1e-12)
        assert v["backward"] == pytest.approx(combine(t.backward_s, bwd_xfer), rel=1e-12)
        flush = t.nonblock_link / 20e9
        step = t.rounds * (v["forward"] + v["backward"]) + t.optimizer_s + flush
        assert v["step"] == pytest.approx(step, rel=1e-12)


def test_round_compute_is_estimates():
    spec = PROFILE
    t = block_terms(LLAMA, PURE_BF16, H100, spec, 16384, 2)
    est = estimate(LLAMA, PURE_BF16.replace(batch=2), ParallelSpec(), H100)
    assert t.forward_s == est["time_s.compute_forward"]
    assert t.backward_s == est["time_s.compute_backward"]
    assert (t.rounds, t.units) == (34, 32)


def test_more_memory_or_bandwidth_never_slows_the_best_plan():
    small = TrainSpec(batch=8, seq=2048, precision="bf16")
    model = get_model("llama3-8b", n_layers=8)
    base = dict(device_budget=12e9, host_budget=40e9, link_bw=25e9, optimizer_state="nvme")
    best = plan_offload(model, small, H100, OffloadSpec(**base), top=1)[0].time_s["step"]
    for change in ({"device_budget": 16e9}, {"host_budget": 60e9}, {"link_bw": 50e9}):
        other = plan_offload(model, small, H100, OffloadSpec(**{**base, **change}), top=1)[0]
        assert other.time_s["step"] <= best * (1 + 1e-9), change


def test_plans_fit_their_budgets_and_are_ranked():
    plans = plan_offload(LLAMA, PURE_BF16, H100, PROFILE, top=5)
    steps = [p.time_s["step"] for p in plans]
    assert steps == sorted(steps)
    for p in plans:
        assert all(p.fits.values())
        assert sum(p.device_bytes.values()) <= PROFILE.device_budget
        assert sum(p.host_bytes.values()) <= PROFILE.host_budget
        assert p.decisions["rounds"] * p.decisions["seqs_per_round"] == 68


def test_the_published_plan_fits_and_is_near_the_best():
    published = evaluate_plan(LLAMA, PURE_BF16, H100, PROFILE, PUBLISHED)
    assert published.fits == {"device_ok": True, "host_ok": True}
    assert published.decisions["rounds"] == 34 and published.decisions["param_slots"] == 5
    best = plan_offload(LLAMA, PURE_BF16, H100, PROFILE, top=1)[0]
    assert best.time_s["step"] <= published.time_s["step"] < 1.05 * best.time_s["step"]
    # fp32 Adam state on the host needs 16 B per parameter: 128 GB > 70 GB
    with pytest.raises(SpecError, match="host_budget must be >= 1"):
        plan_offload(LLAMA, PURE_BF16.replace(precision="bf16-mixed"), H100,
                     OffloadSpec(device_budget=30e9, host_budget=70e9, link_bw=50e9))  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [({"device_budget": 3e9}, "device_budget"), ({"host_budget": 1e9}, "host_budget"),
     ({"link_bw": 0}, "link_bw"), ({"overlap": 1.5}, "overlap"), ({"link_bw": -1.0}, "link_bw"),
     ({"seqs_per_round": (3,)}, "seqs_per_round"), ({"chunks": (3000,)}, "chunks")],
)  # fmt: skip
def test_bad_input_names_the_field(change, field):
    base = dict(device_budget=30e9, host_budget=70e9, link_bw=50e9, optimizer_state="nvme")
    with pytest.raises(SpecError) as err:
        plan_offload(LLAMA, PURE_BF16, H100, OffloadSpec(**{**base, **change}))
    assert err.value.field == field and field in str(err.value)


def test_naive_attention_is_refused():
    with pytest.raises(SpecError, match="attention=flash") as err:
        plan_offload(LLAMA, PURE_BF16.replace(attention="naive"), H100, PROFILE)
    assert err.value.field == "attention"


def test_cli(capsys):
    args = ["offload", "--model", "llama3-8b", "--seq", "8192", "--batch", "68", "--precision",
            "bf16", "--device-budget-gb", "30", "--host-budget-gb", "70",
            "--optimizer-state", "nvme"]  # fmt: skip
    plan = ",".join(f"{k}={v}" for k, v in PUBLISHED.items())
    assert main([*args, "--plan", plan]) == 0
    out = capsys.readouterr().out
    head, given = out.splitlines()[:2]
    assert (
        head == "llama3-8b on one h100-sxm (the default --hardware), its host over pcie5 (the "
        "device's; --link) (overlap 1): batch 68 x seq 8192, bf16"
    )
    assert given == "the plan given" and "34 rounds of 2 sequence(s)" in out
    assert main([*args[:-4], "--host-budget-gb", "5", "--device-budget-gb", "30"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--host-budget-gb must be >=" in err


def test_more_device_budget_is_never_slower_and_never_past_the_device(capsys):
    """A probe: 85 GB gave a 5.53 s step, 300 GB 6.05 s (every gradient that fit was kept
    on the device, so the host optimizer waited for them at the step's end), and 300 GB
    was taken on an 80 GiB H100. The gradients kept are now searched too."""
    from costmodel.cli import main

    steps = []
    for budget in ("40", "60", "85"):
        assert main(["offload", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq",
                     "4096", "--batch", "8", "--device-budget-gb", budget,
                     "--host-budget-gb", "512", "--json"]) == 0  # fmt: skip
        steps.append(json.loads(capsys.readouterr().out)[0]["time_s"]["step"])
    assert steps[0] >= steps[1] >= steps[2]
    assert main(["offload", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq", "4096",
                 "--batch", "8", "--device-budget-gb", "300",
                 "--host-budget-gb", "512"]) == 2  # fmt: skip
    assert "--device-budget-gb must be <= h100-sxm's memory, 85.8993 GB" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"), [("--link-gbps", "-4"), ("--device-budget-gb", "0"), ("--nvme-gbps", "-1")]
)
def test_a_bad_rate_or_budget_names_its_flag_and_the_value_given(capsys, flag, value):
    """Issue 60's fourth probe: ``--link-gbps -4`` said "link_bw must be > 0 (got
    -4000000000.0)", an internal field and the value in bytes."""
    argv = ["offload", "--model", "llama3-8b", "--seq", "8192", "--batch", "68",
            "--link", "pcie5", "--device-budget-gb", "30", "--host-budget-gb", "70",
            flag, value]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be > 0 (got {float(value)})" in err and err.count("\n") == 1, err


def test_a_device_budget_over_the_fit_rule_is_noted_and_the_limit_is_told_exactly(capsys):
    """A probe: a device budget of 85.89 GB (all of an H100's 80 GiB) was priced with no word
    that estimate's fit rule allows 0.9 of it, and 85.9 GB was refused as "must be <= 85.90
    GB (got 85.90 GB)"."""
    argv = ["offload", "--model", "llama3-70b", "--hardware", "h100-sxm", "--batch", "8",
            "--seq", "8192", "--host-budget-gb", "2000", "--device-budget-gb"]  # fmt: skip
    assert main([*argv, "85.89"]) == 0
    assert "note: the device budget, 85.89 GB, is over the fit rule's 77.31 GB" in (
        capsys.readouterr().out)  # fmt: skip
    assert main([*argv, "70"]) == 0
    assert "note:" not in capsys.readouterr().out
    assert main([*argv, "85.9"]) == 2
    assert "must be <= h100-sxm's memory, 85.8993 GB (got 85.9 GB)" in capsys.readouterr().err


def test_the_host_link_is_the_devices_own_unless_given(capsys):
    """Issue 60's fourth probe: every device streamed over PCIe 5, the RTX 4090 and the A100
    included (PCIe 4), the GH200 too (NVLink-C2C): each profile now states its host link,
    the default the header names; --link still overrides it."""
    argv = ["offload", "--model", "llama3-8b", "--batch", "4", "--seq", "2048",
            "--device-budget-gb", "24", "--host-budget-gb", "256"]  # fmt: skip
    for device, link in (("rtx-4090", "pcie4"), ("a100-80gb", "pcie4"), ("gh200", "nvlink-c2c")):
        assert main([*argv, "--hardware", device]) == 0
        assert f"its host over {link} (the device's; --link)" in capsys.readouterr().out
    assert main([*argv, "--hardware", "rtx-4090", "--link", "pcie5"]) == 0
    assert "its host over pcie5 (overlap" in capsys.readouterr().out
