"""How frameworks move and hide data-parallel traffic: NCCL's tree all-reduce latency,
the NICs a group drives across nodes, ZeRO-3's gathers per micro-batch, Megatron's
distributed optimizer and buckets, the gradient reduce beside the last micro-batch, the
network and TP overlap a source states, and held-out runs (issue 12)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from costmodel import TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.parallel.collectives import allreduce_steps, ring_steps, tree_steps
from costmodel.parallel.communication import megatron_bucket
from costmodel.parallel.layout import group_links, members_per_node
from costmodel.specs.parallel import ParallelSpec
from validate.published.compare import rows_for
from validate.published.corpus import case_of, load_runs

H100 = get_hardware("h100-sxm")
MODEL = get_model("llama3-8b")


def values(train: TrainSpec, **layout) -> dict:
    return estimate(MODEL, train, ParallelSpec(**layout), H100).values


@pytest.mark.parametrize(("n", "tree"), [(2, 2), (3, 4), (8, 6), (48, 12), (1024, 20)])
def test_tree_allreduce_takes_two_log2_n_rounds(n, tree):
    """Two trees of depth ceil(log2 n), up and down (NCCL 2.4's double binary tree); the
    all-reduce takes the fewer rounds of ring and tree; at two ranks they are the same."""
    assert int(tree_steps(n)) == tree == 2 * math.ceil(math.log2(n))
    assert int(allreduce_steps(n)) == min(tree, ring_steps("all_reduce", n))


def test_dp_latency_uses_the_tree_rounds():
    """DDP over 64 ranks (8 nodes): per bucket 12 latency rounds, not the ring's 126. The
    reference's DDP reduces its fp32 gradients as they are, and its last bucket, launched
    once the backward ends, runs after it (nothing to hide it)."""
    train = TrainSpec(batch=64, seq=4096, precision="bf16-mixed")
    v = values(train, dp=64)
    grads = 4 * v["params.total"]  # fp32 under torch.autocast
    buckets = math.ceil(grads / (25 * 2**20))
    last = 25 * 2**20 / grads
    beta, alpha = group_links(ParallelSpec(dp=64), H100)["dp"]
    assert alpha == H100.network_latency_s
    expected = (1 - last) * v["comm_bytes.dp"] / beta + 12 * alpha * (buckets - 1)
    assert v["comm_phase_s.dp.backward"] == pytest.approx(expected, rel=1e-12)
    tail = last * v["comm_bytes.dp"] / beta + 12 * alpha
    assert v["comm_phase_s.dp.optimizer"] == pytest.approx(tail, rel=1e-12)


def test_megatron_distributed_optimizer_scatters_then_gathers():
    """Megatron's distributed optimizer reduce-scatters the gradients in backward and
    all-gathers the updated bf16 parameters in forward: the ring all-reduce's bytes, split
    over the two phases; Megatron-Core's buckets hold max(4e7, 1e6·dp) parameters."""
    train = TrainSpec(batch=64, seq=4096, precision="bf16-mixed")
    mega = values(train, framework="megatron", dp=8)
    ddp = values(train, dp=8, grad_reduce_fp32=False)  # the same dtype as Megatron's
    assert mega["comm_bytes.dp"] == pytest.approx(ddp["comm_bytes.dp"], rel=1e-12)
    n, beta = mega["params.total"], H100.link_bw * H100.eff("link")
    buckets = math.ceil(n / 40e6)
    half = 2 * n * 7 / 8
    for phase in ("forward", "backward"):
        expected = half / beta + 7 * H100.link_latency_s * buckets
        assert mega[f"comm_phase_s.dp.{phase}"] == pytest.approx(expected, rel=1e-12)
    assert ddp["comm_phase_s.dp.forward"] == 0
    assert float(megatron_bucket(8)) == 40e6 and float(megatron_bucket(96)) == 96e6


@pytest.mark.parametrize("m", [1, 4])
def test_gradient_reduce_hides_behind_the_last_micro_batch(m):
    """DDP reduces only in the last micro-batch's backward (no_sync before it), so its
    all-reduce hides behind one micro-batch's backward, not the m of the step; contention
    serialises 1 - overlap of the shorter of the compute and the reduce beside it."""
    train = TrainSpec(batch=64 * m, seq=4096, precision="bf16-mixed", grad_accum=m)
    slow = dataclasses.replace(H100, efficiency={**H100.efficiency, "network": 0.1})
    v = estimate(MODEL, train, ParallelSpec(dp=64), slow).values
    one, reduce = v["time_s.microbatch_backward"], v["comm_phase_s.dp.backward"]
    assert v["time_s.compute_backward"] == pytest.approx(m * one, rel=1e-12)
    lost = (1 - H100.overlap) * min(m * one, reduce)
    assert v["time_s.backward"] == pytest.approx((m - 1) * one + max(one, reduce) + lost,
                                                 rel=1e-12)  # fmt: skip
    assert reduce > one  # 16 GB of bf16 gradients over a slow network outlast one


def test_megatron_lm_2024_runs_overlap_tp_as_their_source_says():
    """Megatron-LM's README table notes "overlap of DP/TP/PP comm" (Megatron-Core r0.8,
    Transformer Engine's TP overlap): those runs map to async_tp; Narayanan et al. 2021
    state no such overlap and keep TP exposed."""
    runs = {r["id"]: r for r in load_runs()}
    overlapped = case_of(runs["mlm-h100-weak-32B"])
    assert overlapped.parallel.async_tp
    assert any("TP communication overlapped" in a for a in overlapped.assumptions)
    assert not case_of(runs["narayanan21-a100-145B"]).parallel.async_tp
    assert not case_of(runs["mlm-h100-weak-1.7B"]).parallel.async_tp  # tp 1: nothing to hide


@pytest.mark.parametrize(
    ("layout", "members"),
    [({"fsdp": 64}, 8), ({"tp": 2, "fsdp": 32}, 4), ({"tp": 8, "dp": 8}, 1), ({"fsdp": 8}, 8)],
)
def test_a_group_sends_through_the_nics_its_members_hold(layout, members):
    """A ring across nodes runs one channel per NIC, so the g members a node holds drive g
    NICs at once (capped by NVLink); inside one node the group runs on NVLink."""
    par = ParallelSpec(**layout)
    name = "dp" if "dp" in layout else "fsdp"
    stride = par.tp
    assert members_per_node(stride, getattr(par, name), 8) == members
    beta = group_links(par, H100)[name][0]
    link = H100.link_bw * H100.eff("link")
    if stride * getattr(par, name) <= 8:
        assert beta == link
    else:
        assert beta == pytest.approx(min(link, members * H100.network_bw * H100.eff("network")))


@pytest.mark.parametrize("m", [1, 4])
def test_zero3_gathers_and_scatters_every_micro_batch(m):
    """FSDP (ZeRO-3) under gradient accumulation frees what each micro-batch gathered:
    every micro-batch gathers in forward, again in backward, and reduce-scatters (the
    reference's gradients in fp32, their dtype under torch.autocast)."""
    train = TrainSpec(batch=8 * m, seq=4096, precision="bf16-mixed", grad_accum=m)
    v = values(train, fsdp=8)
    one = 2 * v["params.total"] * 7 / 8  # one pass of bf16 all-gathers
    assert v["comm_bytes.fsdp"] == pytest.approx((2 + 2) * m * one, rel=1e-12)
    # no backward re-gather: FSDP2's option (its memory is priced there alone)
    kept = values(train, fsdp=8, reshard_after_forward=False, framework="fsdp2",
                  grad_reduce_fp32=False)  # fmt: skip
    assert kept["comm_bytes.fsdp"] == pytest.approx(2 * m * one, rel=1e-12)


def test_a_pipeline_stage_gathers_once_per_step():
    """torchtitan keeps a pipeline stage unsharded from its first micro-batch to its last
    and reduce-scatters once: one gather and one scatter per step, whatever m."""
    train = TrainSpec(batch=32, seq=4096, precision="bf16-mixed", grad_accum=8)
    few = values(train, framework="fsdp2", fsdp=4, pp=2)
    more = values(dataclasses.replace(train, batch=64, grad_accum=16), framework="fsdp2",
                  fsdp=4, pp=2)  # fmt: skip
    assert few["comm_bytes.fsdp"] == pytest.approx(more["comm_bytes.fsdp"], rel=1e-12)


def test_the_corpus_takes_the_network_a_source_states():
    """IBM's FSDP runs state 400 and 800 Gb/s per node (pytorch.org, "Maximizing training
    throughput using PyTorch FSDP", 2024): 6.25 and 12.5 GB/s per GPU, not a DGX's NICs."""
    runs = {r["id"]: r for r in load_runs()}
    for rid, per_gpu in (("ibm-fsdp-llama2-7b-a100", 6.25e9), ("ibm-fsdp-llama2-7b-h100", 12.5e9)):
        case = case_of(runs[rid])
        assert case.hardware.network_bw == per_gpu
        assert any("as stated" in a for a in case.assumptions)
    assert case_of(runs["mlm-h100-weak-32B"]).hardware.network_bw == H100.network_bw


def test_held_out_runs():
    """Runs never used to calibrate (validate/published/data/holdout.json, from
    NVIDIA/dgxc-benchmarking). MaxText Llama-2-70B, FSDP on 64-2048 DGX H100: bf16 within
    5 % (measured -3.3 to -4.4 %; +0.4 to +1.7 % before the profiles priced contention beside
    the overlapped gathers, when network efficiency was fitted at 0.46 instead), fp8 within
    13 % (-12.0 to +2.5 %; 1.4-19.1 % too fast while fp8 GEMMs ran at bf16's efficiency,
    before ``efficiency.matmul_fp8`` was measured); with one NIC per ring they were 33-58 %
    too slow, the FSDP gathers alone longer than the measured step. NeMo Llama-3.1-70B (TP 4,
    PP 4, CP 2, VP 5; 64-2048) and 405B (TP 8, PP 9, CP 2, VP 7; 576-2304), TP overlap on as
    their launcher configs set it: bf16 within 10 % (3.0-4.6 %), fp8 within 13 % (the 405B's
    -12.6 % at 576 and 1,152 GPUs: too slow, not explained; -3.8 % before fp8 had its own
    efficiency)."""
    path = Path(__file__).parents[1] / "validate" / "published" / "data" / "holdout.json"
    rows = [r for run in load_runs(path) for r in rows_for(run)]
    assert len(rows) == 30 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        maxtext_bf16 = r["case"].startswith("maxtext") and "bf16" in r["case"]
        fp8 = "fp8" in r["case"] and ("405b" in r["case"] or r["case"].startswith("maxtext"))
        bound = 0.05 if maxtext_bf16 else (0.13 if fp8 else 0.10)
        assert abs(r["rel_err"]) <= bound, (r["case"], r["rel_err"])


def test_moe_held_out_runs_map_to_their_stated_layouts():
    """NVIDIA's published Megatron-Bridge MoE runs (validate/published/data/holdout_moe.json;
    never calibrated on): each maps to its preset, device and stated degrees, ep included,
    and is predicted. costmodel is too fast on all ten (+12 to +210 %: fine-grained
    Qwen3-30B-A3B on B200 worst), a known gap the closing note of issue 16 records; this
    test pins the mapping, not the error."""
    path = Path(__file__).parents[1] / "validate" / "published" / "data" / "holdout_moe.json"
    runs = load_runs(path)
    rows = [r for run in runs for r in rows_for(run)]
    assert len(rows) == 10 and all(r["status"] == "ok" for r in rows)
    for run in runs:
        case = case_of(run)
        stated = run["parallelism"]
        assert case.model.name == run["model"]["preset"] and case.model.moe
        assert case.hardware.name.split("-")[0] in run["hardware"].lower()
        assert (case.parallel.pp, case.parallel.ep) == (stated["pp"], stated["ep"])
        assert case.parallel.devices == run["n_gpus"] and case.parallel.framework == "megatron"
        per_device = case.train.micro_batch // case.parallel.batch_step(1)
        assert case.train.precision == "fp8" and per_device == run["micro_batch"]


def test_megatron_sequence_parallel_backward_hides_the_column_linears_collectives():
    """Korthikanti et al. 2022, Sec. 4.2.2 (Megatron-Core's
    LinearWithGradAccumulationAndAsyncCommunication): each block's column-parallel linears
    gather their saved input shard again beside dgrad and reduce-scatter the input
    gradient beside wgrad. Bytes: half a backward all-reduce more per sub-block (the
    re-gather) than DTensor's SP, which saves the gathered input; seconds: a backward
    all-reduce's worth hidden, so the step is shorter than with all of it exposed."""
    from costmodel import ModelSpec

    model = ModelSpec(vocab=32000, d_model=1024, n_layers=4, n_heads=8, d_ff=4096)
    train = TrainSpec(batch=8, seq=256, grad_accum=1)
    est = {(fw, a): estimate(model, train, ParallelSpec(tp=2, dp=4, sequence_parallel=True,
                                                         framework=fw, async_tp=a), H100)
           for fw in ("megatron", "fsdp2") for a in (False, True)}  # fmt: skip
    regather = 4 * 1 * 2 * 512 * 1024  # L, all-reduce bus factor at tp 2, bf16, b·T, D
    mine, dtensor = est[("megatron", False)], est[("fsdp2", False)]
    assert mine["comm_bytes.tp"] - dtensor["comm_bytes.tp"] == regather
    hidden = mine["comm_overlapped_s.tp"]
    exposed = mine["comm_phase_s.tp.backward"] - hidden
    assert 0 < exposed < hidden  # the row-parallel gathers stay exposed, the rest hidden
    assert dtensor["comm_overlapped_s.tp"] == 0
    # async TP keeps pricing every TP collective by its chunked overlap (1/tp exposed)
    assert est[("megatron", True)]["comm_bytes.tp"] == dtensor["comm_bytes.tp"]
    assert est[("megatron", True)]["comm_overlapped_s.tp"] == 0


def test_one_ddp_bucket_of_every_gradient_hides_nothing():
    """Issue 60's seventh probe: --bucket-mb 100000 (one bucket of every gradient) hid the
    whole all-reduce and made the step faster; DDP launches a bucket once its last gradient
    is ready, so that one runs after the backward, exposed. Within a node (the reduce
    shorter than the backward) the default 25 MiB buckets are faster."""
    train = TrainSpec(batch=64, seq=1024, precision="bf16-mixed")
    model = get_model("gpt2-xl")
    small, one = (estimate(model, train, ParallelSpec(dp=8, bucket_mb=mb), H100).values
                  for mb in (25, 1e5))  # fmt: skip
    assert one["comm_phase_s.dp.backward"] == 0
    assert one["comm_phase_s.dp.optimizer"] == pytest.approx(one["comm_time_s.dp"])
    assert one["time_s.step"] > small["time_s.step"]
