"""FSDP and TP communication counted exactly, collectives fitted, the suites in the runner,
and the same checks under torchrun (2 gloo ranks on CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel import ParallelSpec, estimate, get_hardware
from costmodel.parallel.collectives import bus_factor, collective_time, ring_steps
from validate import run as run_module
from validate.distributed.checks import parallel_spec, spec_and_train, step
from validate.distributed.collectives import aggregate, bench, fit_alpha_beta, write_link_profile
from validate.distributed.launch import launch
from validate.report.results import read_rows

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("kind", ["fsdp", "fsdp-by-hand", "tp", "tp-sp"])
def test_fsdp_and_tp_bytes_equal_costmodel(kind):
    batch, seq = 4, 32
    results = launch(step, 2, kind, batch, seq, "fp32", timeout_s=180)
    spec, train = spec_and_train(batch, seq, "fp32")
    par = parallel_spec(kind, 2)
    predicted = estimate(spec, train, par, get_hardware("cpu"))[f"comm_bytes.{kind.split('-')[0]}"]
    for r in results:
        assert r["ring_bytes"] == predicted
        # the time inside the counted collectives: part of the step, never negative
        assert 0 < r["comm_s"] <= r["seconds"]
    layers = spec.n_layers
    if kind == "fsdp":  # embedding, blocks, final norm + head: gathered twice, reduced once
        assert results[0]["calls"] == {"all_gather": 2 * (layers + 2), "reduce_scatter": layers + 2}
    elif kind == "fsdp-by-hand":  # each matrix gathered in forward, again in backward
        # but the embedding's, reduced once; each norm's gradient all-reduced
        matrices = 7 * layers + 2
        assert results[0]["calls"] == {"all_gather": 2 * matrices - 1,
                                       "reduce_scatter": matrices,
                                       "all_reduce": 2 * layers + 1}  # fmt: skip
    elif kind == "tp":  # Megatron: one all-reduce per half-block forward (g) and backward
        # (f), the vocab-parallel embedding's forward and head's backward, and the loss's 3
        assert results[0]["calls"] == {"all_reduce": 4 * layers + 2 + 3}
    else:  # each all-reduce split into a reduce-scatter and an all-gather; the loss's stay
        split = 4 * layers + 2
        assert results[0]["calls"] == {"all_gather": split, "reduce_scatter": split,
                                       "all_reduce": 3}  # fmt: skip


def test_collectives_are_timed_and_fitted(tmp_path):
    per_rank = launch(
        bench, 2, [2**16, 2**18, 2**20], 2, ("all_reduce", "broadcast"), timeout_s=120
    )
    rows = aggregate(per_rank, 2)
    assert {(r["op"], r["size_bytes"]) for r in rows} == {
        (op, s) for op in ("all_reduce", "broadcast") for s in (2**16, 2**18, 2**20)
    }
    for r in rows:
        assert r["seconds"] > 0 and r["busbw"] == pytest.approx(
            bus_factor(r["op"], 2) * r["size_bytes"] / r["seconds"]
        )
    alpha, beta = fit_alpha_beta([r for r in rows if r["op"] == "all_reduce"])
    assert alpha >= 0 and beta > 0
    profile = tmp_path / "profile.json"
    shutil.copy(ROOT / "costmodel/catalog/data/hardware.json", tmp_path / "catalog.json")
    profile.write_text(json.dumps(json.loads((tmp_path / "catalog.json").read_text())["cpu"]))
    write_link_profile(profile, alpha, beta, "gloo")
    hw = get_hardware(str(profile))
    assert hw.link_bw == beta and hw.link_latency_s == alpha


def test_alpha_beta_fit_recovers_a_known_link():
    alpha, beta = 5e-5, 2e9
    rows = [
        {"op": op, "size_bytes": s, "world": n, "seconds": collective_time(op, s, n, alpha, beta)}
        for op in ("all_reduce", "all_gather")
        for s in (2**16, 2**20, 2**24)
        for n in (2, 4)
    ]
    fitted = fit_alpha_beta(rows)
    assert fitted == pytest.approx((alpha, beta), rel=1e-6)
    assert ring_steps("all_reduce", 4) == 6 and bus_factor("all_gather", 4) == 0.75


def test_parallel_and_ddp_suites_in_the_runner(tmp_path):
    out = tmp_path / "out"
    args = ["--quick", "--device", "cpu", "--out", str(out), "--hardware", "cpu"]
    assert run_module.main([*args, "--suite", "parallel", "--filter", "tp/"]) == 0
    assert run_module.main([*args, "--suite", "ddp", "--filter", "flat", "--resume"]) == 0
    rows = read_rows(out)
    exact = [r for r in rows if r["quantity"] == "comm_bytes.tp"]
    assert len(exact) == 2 and all(r["rel_err"] == 0 for r in exact)
    (timed,) = [r for r in rows if r["quantity"] == "comm_time_s.tp"]
    assert timed["measured"] == max(timed["per_rank_comm_s"]) > 0
    assert "perf_counter" in timed["measured_as"]
    flat = [r for r in rows if r["suite"] == "ddp"]
    assert {r["quantity"] for r in flat} == {"time_s.step", "comm_time_s"}
    assert "DDP variants" in (out / "report.md").read_text()


def test_the_same_check_under_torchrun():
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not next to this python")
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "validate.distributed.torchrun",
        "tp",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    spec, train = spec_and_train(2, 64, "fp32")
    predicted = estimate(spec, train, ParallelSpec(tp=2), get_hardware("cpu"))["comm_bytes.tp"]
    assert [r["ring_bytes"] for r in result["ranks"]] == [predicted, predicted]


@pytest.mark.gpu
def test_nccl_fsdp_bytes_on_two_gpus():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    results = launch(step, 2, "fsdp", 4, 32, "fp32", backend="nccl", timeout_s=300)
    spec, train = spec_and_train(4, 32, "fp32")
    predicted = estimate(spec, train, ParallelSpec(fsdp=2), get_hardware("h100-sxm"))
    assert all(r["ring_bytes"] == predicted["comm_bytes.fsdp"] for r in results)


def test_zero1_state_rows_against_costmodel(tmp_path):
    out = tmp_path / "out"
    args = ["--quick", "--device", "cpu", "--out", str(out), "--hardware", "cpu"]
    assert run_module.main([*args, "--suite", "ddp", "--filter", "zero1"]) == 0
    rows = {(r["quantity"], r.get("rank")): r for r in read_rows(out)}
    assert rows[("memory_bytes.optimizer.all_ranks", None)]["rel_err"] == 0
    halves = [rows[("memory_bytes.optimizer", k)]["measured"] for k in (0, 1)]
    assert all(0 < h < sum(halves) for h in halves)
