"""Per-rank memory: what each gloo rank holds under DDP, ZeRO-1 and FSDP2, against
costmodel's per-device prediction for the same layout and framework (issue 13, item 1),
for the dense reference model and a mixture-of-experts one, also under expert
parallelism (issue 16)."""

from __future__ import annotations

import functools

import pytest
import torch

from costmodel import ParallelSpec, TrainSpec, estimate, get_hardware
from validate.distributed.checks import small_spec
from validate.distributed.launch import launch
from validate.distributed.memory import (
    LAYOUTS,
    PEAKS,
    STATE,
    TENSOR_PARALLEL,
    LayoutCase,
    measure_least,
    predicted,
)
from validate.probes.live import LiveBytes

HW = get_hardware("cpu")
N_PARAMS = estimate(small_spec(), TrainSpec(batch=4, seq=64)).values["params.total"]


@functools.cache
def run(case: LayoutCase) -> tuple[list[dict], dict[str, float]]:
    """(each rank's measurement, costmodel's per-device prediction). Measured twice in one
    launch (``measure_least``), keeping each rank's smaller bytes: gloo's worker threads
    sometimes release a collective's tensors late, so a rank-run now and then holds one
    more gathered matrix at a peak
    (never one too few). Seen with other jobs on the cores in about one bf16 rank-run in
    six of the hand-written FSDP (+32 to +133 KB; not removed by waiting for gloo to drop
    the tensors, ``settled``, by an all-gather done in place, or by collecting cycles only
    at fixed points), and once in CI for FSDP2's bf16 after-forward bytes (+64 KB, one
    unsharded matrix)."""
    if case.layout in TENSOR_PARALLEL:  # a second step in the same process holds 0.25 MB
        # less at its peaks (something DTensor's first step makes and keeps): launch twice
        runs = [launch(measure_least, case.world, case, 1, backend="gloo", timeout_s=600)
                for _ in range(2)]  # fmt: skip
        results = [{k: min(a[k], b[k]) for k in a} for a, b in zip(*runs, strict=True)]
    else:  # the hand-written FSDP frees a gathered matrix right after each collective:
        runs = 4 if case.layout == "fsdp-by-hand" else 2  # under load gloo is late more often
        results = launch(measure_least, case.world, case, runs, backend="gloo", timeout_s=600)
    est = estimate(case.spec(), case.train(), case.parallel(), HW)
    return results, predicted(case, est.values)


CASES = [LayoutCase(lay, precision=p) for lay in LAYOUTS for p in ("fp32", "bf16-mixed")]
# the hand-written FSDP on 3 ranks (every shard padded) and on 4 (one sequence each: the
# weight gradients' reduce-scatter outgrows the logits)
HAND_ON_FOUR = LayoutCase("fsdp-by-hand", world=4, precision="bf16-mixed")
"""In the slow suite (36 s on two cores); the 3 ranks of padded shards stay."""
CASES += [LayoutCase("fsdp-by-hand", world=3, batch=6), HAND_ON_FOUR]
# a mixture-of-experts model (4 routed experts, top-2, one shared, a dense first block):
# FSDP2 gathers an MoE block at a time, DDP holds every expert
CASES += [LayoutCase("fsdp2", experts=4), LayoutCase("ddp", precision="bf16-mixed", experts=4)]
# expert parallelism over both ranks (balanced routing): DDP for the rest, or FSDP2 as
# torchtitan shards it (the dense parameters over both ranks, each rank's experts whole)
CASES += [LayoutCase("ep", precision="bf16-mixed", experts=4), LayoutCase("ep-fsdp2", experts=4)]
ALSO = {
    "ddp": "fp32",
    "zero1": "fp32",
    "fsdp2": "fp32",
    "fsdp2-noreshard": "bf16-mixed",
    "fsdp-by-hand": "fp32",
    "tp": "bf16-mixed",
    "tp-sp": "fp32",
    "cp": "bf16-mixed",
}
"""The precision each dense layout runs in the default suite (both precisions between them);
the other one is ``slow`` (``pytest -m slow``): each case is a launch of gloo ranks, and
these launches set the suite's time on two cores."""
SLOW = frozenset(LayoutCase(lay, precision=p) for lay in LAYOUTS for p in ("fp32", "bf16-mixed")
                 if p != ALSO[lay]) | {HAND_ON_FOUR}  # fmt: skip


def _param(case: LayoutCase, *more: str) -> object:
    marks = [pytest.mark.slow] if case in SLOW else []
    return pytest.param(case, *more, id="-".join((case.name, *more)), marks=marks)


CASE_PARAMS = [_param(c) for c in CASES]
PEAK_PARAMS = [_param(c, q) for c in CASES for q in PEAKS]


def _rel(pred: float, measured: float) -> float:
    return abs(pred - measured) / measured


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_state_bytes_summed_over_ranks_are_exact(case: LayoutCase) -> None:
    results, pred = run(case)
    for q in STATE:
        assert sum(r[q] for r in results) == pred[q] * case.world, q


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_bytes_kept_after_forward_within_half_a_percent(case: LayoutCase) -> None:
    results, pred = run(case)
    for r in results:
        assert _rel(pred["after_forward"], r["after_forward"]) < 0.005


@pytest.mark.parametrize(("case", "quantity"), PEAK_PARAMS)
def test_peaks_within_five_percent(case: LayoutCase, quantity: str) -> None:
    results, pred = run(case)
    for r in results:
        assert _rel(pred[quantity], r[quantity]) <= 0.05, (pred[quantity], r[quantity])


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16-mixed", marks=pytest.mark.slow)])
def test_fsdp2_peaks_by_position_are_within_a_thousandth(precision: str) -> None:
    """FSDP2's schedule (costmodel.frameworks.fsdp2): two units in flight at the last block
    and at the head, the head's reduce-scatter input held into the top block's backward,
    the top block's into the next block's copy-out; what is left is a few bytes of
    scalars."""
    case = LayoutCase("fsdp2", precision=precision)
    results, pred = run(case)
    for r in results:
        for q in PEAKS:
            assert _rel(pred[q], r[q]) < 1e-3, (q, pred[q], r[q])


HAND = [_param(c) for c in CASES if c.layout == "fsdp-by-hand"]


@pytest.mark.parametrize("case", HAND)
def test_fsdp_by_hand_peaks_by_position_are_within_a_gathered_matrix(case: LayoutCase) -> None:
    """costmodel.frameworks.handwritten's positions are exact to 0.2 %; a rank may hold one
    gathered matrix more, when gloo's worker thread releases an all-gather's output after
    the rank moved on (its release races the next op; NCCL holds no such reference)."""
    results, pred = run(case)
    matrix = estimate(small_spec(), case.train(), case.parallel(), HW).values[
        "memory_bytes_per_device.params"
    ]
    for r in results:
        for q in PEAKS:
            extra = r[q] - pred[q]
            assert -2e-3 * pred[q] <= extra <= 2e-3 * pred[q] + matrix, (q, pred[q], r[q])


def _reduce_scatter_both_ways(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    from torch import distributed as dist

    from validate.distributed.memory import InPlaceReduceScatter

    grads = torch.arange(12.0) * (rank + 1)
    native = torch.empty(12 // world)
    dist.reduce_scatter_tensor(native, grads.clone(), op=dist.ReduceOp.AVG)
    ours = torch.empty(12 // world)
    InPlaceReduceScatter()(ours, grads.clone(), dist.group.WORLD, dist.ReduceOp.AVG)
    return native, ours


def test_in_place_reduce_scatter_equals_gloo_s_own() -> None:
    for native, ours in launch(_reduce_scatter_both_ways, 2, backend="gloo", timeout_s=120):
        assert torch.equal(native, ours)


def test_fsdp2_on_four_ranks_holds_a_quarter() -> None:
    case = LayoutCase("fsdp2", world=4, batch=8)
    results, pred = run(case)
    whole = 4 * N_PARAMS
    for r in results:
        assert r["params"] == r["grads"] == pred["params"] == whole // 4
        assert r["optimizer"] == 2 * whole // 4


def test_zero1_shards_are_balanced_largest_first() -> None:
    results, _ = run(LayoutCase("zero1"))
    shares = [r["optimizer"] for r in results]
    assert max(shares) - min(shares) <= 2 * 4 * small_spec().d_model  # one norm's moments


# closed forms behind the rows


def test_ddp_buckets_are_one_gradient_copy_held_throughout() -> None:
    train = TrainSpec(batch=4, seq=64)
    grads = 4 * N_PARAMS
    for par, buckets in [
        (ParallelSpec(dp=2), grads),
        (ParallelSpec(fsdp=2, zero=1), grads),
        (ParallelSpec(), 0),
        (ParallelSpec(fsdp=2), 0),
        (ParallelSpec(dp=2, fsdp=2), 0),
        (ParallelSpec(dp=2, framework="fsdp2"), 0),
        (ParallelSpec(dp=2, framework="megatron"), 0),
    ]:
        values = estimate(small_spec(), train, par, HW).values
        assert values["memory_bytes_per_device.buffers"] == buckets, par
    # held through every phase: a replica's peaks rise by exactly the buckets
    two = estimate(small_spec(), train, ParallelSpec(dp=2), HW).values
    one = estimate(small_spec(), TrainSpec(batch=2, seq=64), ParallelSpec(), HW).values
    for q in PEAKS:
        key = f"memory_bytes_per_device.{q}"
        assert two[key] - one[key] == grads, q


def test_fsdp2_gathers_in_fp32_too_and_keeps_every_layer_without_resharding() -> None:
    spec, train = small_spec(), TrainSpec(batch=4, seq=64, precision="fp32")
    n = N_PARAMS
    reshard = estimate(spec, train, ParallelSpec(fsdp=2, framework="fsdp2"), HW).values
    keep = ParallelSpec(fsdp=2, framework="fsdp2", reshard_after_forward=False)
    kept = estimate(spec, train, keep, HW).values
    d, f = spec.d_model, spec.d_ff
    block = 4 * d * d + 3 * d * f + 2 * d  # q, k, v, o; SwiGLU's three; two RMSNorm gains
    assert reshard["memory_bytes_per_device.master"] == 4 * n // 2
    # a block unsharded and one flat all-gather buffer (blocks are the largest unit here)
    assert reshard["memory_bytes_per_device.params"] == 2 * 4 * block
    # every unit unsharded, plus the last block's flat buffer at the head's all-gather
    assert kept["memory_bytes_per_device.params"] == 4 * n + 4 * block


def test_live_bytes_sees_a_storage_resized_to_nothing() -> None:
    with LiveBytes(torch.device("cpu")) as mem:
        x = torch.ones(1024)
        assert mem.now() == 4096
        x.untyped_storage().resize_(0)  # how FSDP2 frees a gathered parameter
        assert mem.now() == 0
        x.untyped_storage().resize_(4096)
        y = x + 1  # an op after the re-allocation records the new high-water mark
        assert mem.peak() >= 2 * 4096
        del y


@pytest.mark.parametrize("precision", [pytest.param("fp32", marks=pytest.mark.slow), "bf16-mixed"])
def test_ring_attention_sends_what_costmodel_predicts(precision: str) -> None:
    """Context parallelism by hand (validate.distributed.context): each rank sends, per
    layer, its K/V chunk N - 1 hops in forward and backward and fp32 K/V gradient
    accumulators N hops, as torch's context_parallel does; ``comm_bytes.cp`` exactly."""
    case = LayoutCase("cp", precision=precision)
    results, _ = run(case)
    est = estimate(small_spec(), case.train(), case.parallel(), HW)
    assert [r["sent_bytes"] for r in results] == [est["comm_bytes.cp"]] * case.world


def test_all_to_alls_send_what_costmodel_predicts() -> None:
    """Expert parallelism by hand (validate.distributed.expert), balanced routing: each
    rank sends (ep - 1)/ep of its k routed copies of every token to the other rank, and
    as much back, in forward and in backward; ``comm_bytes.ep`` exactly."""
    case = LayoutCase("ep", precision="bf16-mixed", experts=4)
    results, _ = run(case)
    est = estimate(case.spec(), case.train(), case.parallel(), HW)
    assert [r["sent_bytes"] for r in results] == [est["comm_bytes.ep"]] * case.world
    assert [r["imbalance"] for r in results] == [1.0] * case.world
