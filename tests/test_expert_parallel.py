"""Expert parallelism (issue 16): what a device holds, sends and runs when each rank of
an ep group keeps n_experts / ep routed experts, in closed form, also under pipelining;
the hand-written expert parallelism (validate/distributed/expert.py) trains as the whole
model does, and its busiest rank holds what costmodel says at the imbalance it measured.
Per-rank bytes and all-to-all volume under balanced routing are in
tests/test_rank_memory.py; MoE pipeline stages in tests/test_pipeline_memory.py."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import ParallelSpec, TrainSpec, estimate, get_model, sweep
from costmodel.catalog.hardware import get_hardware
from costmodel.single.params import param_breakdown
from costmodel.specs.checks import SpecError
from costmodel.symbols import values_for
from costmodel.symbols.algebra import by_symbol
from validate.distributed.expert import model_check
from validate.distributed.launch import launch
from validate.distributed.memory import LayoutCase, measure_least, predicted

H100 = get_hardware("h100-sxm")
MIXTRAL = get_model("mixtral-8x7b")
TRAIN = TrainSpec(batch=64, seq=4096, grad_accum=8, recompute="full")
N = int(param_breakdown(MIXTRAL)["total"].subs(values_for(MIXTRAL)))
EXPERTS = int(param_breakdown(MIXTRAL)["experts"].subs(values_for(MIXTRAL)))


def _values(par: ParallelSpec, train: TrainSpec = TRAIN) -> dict[str, float]:
    return estimate(MIXTRAL, train, par, H100).values


def _mem(values: dict[str, float], key: str) -> float:
    return values[f"memory_bytes_per_device.{key}"]


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_megatron_holds_its_experts_and_shards_their_state_over_expert_data_parallel(ep):
    """bf16 weights and the gradient buffer (bf16: gradients reduced in the compute dtype,
    Megatron's default here) of the dense parameters and of E/ep experts, with the fp32
    copy of its shard the step makes; fp32 master and Adam state over every data-parallel
    rank (the experts' over the dp/ep ranks holding each: the same bytes per device as
    without ep)."""
    without, values = (
        _values(ParallelSpec(dp=8, framework="megatron")),
        _values(ParallelSpec(dp=8, ep=ep, framework="megatron")),
    )
    local = N - EXPERTS + EXPERTS // ep
    assert _mem(values, "params") == 2 * local
    fp32_shard = _mem(values, "master")  # 4 bytes per parameter of the optimizer's shard
    assert _mem(values, "grads") == pytest.approx(2 * local, rel=1e-12)
    assert _mem(values, "step_grads") == pytest.approx(fp32_shard, rel=1e-12)
    for key in ("master", "optimizer"):
        assert _mem(values, key) == pytest.approx(_mem(without, key), rel=1e-12)
    fp32 = _values(ParallelSpec(dp=8, ep=ep, framework="megatron", grad_reduce_fp32=True))
    assert _mem(fp32, "grads") == 4 * local and _mem(fp32, "step_grads") == 0


def test_fsdp2_gathers_an_moe_block_with_its_ranks_experts_only():
    """FSDP2 over 8 ranks with ep 8: the experts are not sharded further (one per rank),
    the dense parameters over all 8; sharded state per device is conserved, and the
    gathered block holds one expert instead of eight."""
    plain = _values(ParallelSpec(fsdp=8, framework="fsdp2"))
    ep8 = _values(ParallelSpec(fsdp=8, ep=8, framework="fsdp2"))
    for key in ("master", "grads", "optimizer"):
        assert _mem(ep8, key) == pytest.approx(_mem(plain, key), rel=1e-12)
    expert = 3 * 4096 * 14336  # one SwiGLU expert
    assert _mem(plain, "params") - _mem(ep8, "params") == 2 * 2 * 7 * expert  # two units


def test_all_to_all_volume_in_closed_form():
    """Per MoE block and micro-batch: dispatch and combine in forward, their gradients in
    backward, again in forward under full recomputation: 6 all-to-alls of the device's
    b·T tokens times k copies of D bf16 values, (ep - 1)/ep of them leaving the rank."""
    for ep in (2, 8):
        values = _values(ParallelSpec(fsdp=8, ep=ep, framework="fsdp2"))
        tokens = 64 // 8 * 4096  # per device per step (8 micro-batches of one sequence)
        one = 2 * tokens * 2 * 4096 * (ep - 1) / ep
        assert values["comm_bytes.ep"] == pytest.approx(32 * 6 * one, rel=1e-12)
    no_ep = _values(ParallelSpec(fsdp=8, framework="fsdp2"))
    assert no_ep["comm_bytes.ep"] == 0 and no_ep["comm_time_s.ep"] == 0


def test_all_to_all_leaves_the_node_beyond_its_devices():
    """An ep group of 8 sits in one 8-GPU node (NVLink); of 16 it spans two (the
    network's per-GPU share), which takes longer per byte (DeepSeekMoE-16B: 64 experts)."""
    model, train = get_model("deepseek-moe-16b"), TRAIN.replace(batch=128)
    inside, across = (estimate(model, train, ParallelSpec(fsdp=16, ep=ep, framework="fsdp2"),
                               H100).values for ep in (8, 16))  # fmt: skip
    per_byte = [v["comm_time_s.ep"] / v["comm_bytes.ep"] for v in (inside, across)]
    assert per_byte[1] > 2 * per_byte[0]


def test_imbalance_scales_the_busiest_ranks_experts_and_traffic_only_under_ep():
    base = ParallelSpec(fsdp=8, ep=8, framework="fsdp2")
    even, skewed = _values(base), _values(base.replace(ep_imbalance=1.5))
    assert skewed["comm_bytes.ep"] == pytest.approx(1.5 * even["comm_bytes.ep"], rel=1e-12)
    assert skewed["roofline.experts.time_s"] > 1.4 * even["roofline.experts.time_s"]
    assert skewed["roofline.attn_q.time_s"] == even["roofline.attn_q.time_s"]
    kept = [_mem(_values(p, TRAIN.replace(recompute="none")), "activations")
            for p in (base, base.replace(ep_imbalance=1.5))]  # fmt: skip
    assert kept[1] > kept[0]
    assert skewed["time_s.step"] > even["time_s.step"]
    # without expert parallelism every rank runs its own tokens' pairs: no busiest rank
    one = ParallelSpec(fsdp=8, framework="fsdp2")
    assert _values(one.replace(ep_imbalance=1.5)) == _values(one)


def test_capacity_caps_what_the_busiest_rank_runs_and_receives():
    """Pairs past an expert's capacity are dropped before dispatch (Switch Transformer,
    Sec. 2.2; Megatron's --moe-expert-capacity-factor): at imbalance 1.5 and capacity 1.25
    the busiest rank receives and runs 1.25x the mean, a sixth of its pairs dropped; a
    capacity above the imbalance drops nothing, and 0 is dropless."""
    base = ParallelSpec(fsdp=8, ep=8, framework="fsdp2", ep_imbalance=1.5)
    even = _values(base.replace(ep_imbalance=1.0))
    skewed, capped, roomy = (_values(base.replace(capacity_factor=c)) for c in (0.0, 1.25, 2.0))
    assert capped["comm_bytes.ep"] == pytest.approx(1.25 * even["comm_bytes.ep"], rel=1e-12)
    assert capped["moe.dropped_fraction"] == pytest.approx(1 - 1.25 / 1.5, rel=1e-12)
    times = [v["roofline.experts.time_s"] for v in (even, capped, skewed)]
    assert times[0] < times[1] < times[2]
    assert roomy == skewed and skewed["moe.dropped_fraction"] == 0
    # without expert parallelism every rank runs its own pairs: nothing to cap
    one = ParallelSpec(fsdp=8, framework="fsdp2", capacity_factor=1.0)
    assert _values(one)["moe.dropped_fraction"] == 0


def test_a_padded_dispatch_runs_and_sends_every_experts_whole_capacity():
    """``capacity_pad`` (Megatron-Core's ``drop_and_pad``, GShard's and MaxText's dense
    dispatch): every expert runs, receives and keeps its whole capacity whatever the
    routing, so balanced routing at capacity 1.25 sends and computes 1.25x the routed
    pairs and drops none; past the capacity (imbalance 1.5) the same pairs drop as without
    padding. A padding without a capacity is refused, naming the field."""
    base = ParallelSpec(fsdp=8, ep=8, framework="fsdp2")
    even = _values(base)
    padded = _values(base.replace(capacity_factor=1.25, capacity_pad=True))
    assert padded["comm_bytes.ep"] == pytest.approx(1.25 * even["comm_bytes.ep"], rel=1e-12)
    assert padded["moe.dropped_fraction"] == 0
    assert padded["roofline.experts.time_s"] > even["roofline.experts.time_s"]
    skewed = base.replace(ep_imbalance=1.5, capacity_factor=1.25)
    assert _values(skewed.replace(capacity_pad=True)) == _values(skewed)
    with pytest.raises(SpecError, match=r"capacity_pad .* needs a capacity_factor") as err:
        ParallelSpec(capacity_pad=True)
    assert err.value.field == "capacity_pad"


def test_capacity_and_imbalance_sweep_as_real_numbers():
    """A sweep over capacity and imbalance (real numbers, not rounded to integers) equals
    the estimates point by point."""
    grid = {
        "capacity_factor": np.array([0.0, 1.0, 1.25]),
        "ep_imbalance": np.array([1.5, 1.5, 1.2]),
    }
    fixed = {"ep": 8, "fsdp": 8, "framework": "fsdp2", "batch": 64, "seq": 4096, "grad_accum": 1}
    keys = ("time_s.step", "moe.dropped_fraction", "comm_bytes.ep")
    got = sweep(MIXTRAL, quantities=keys, hardware=H100, **grid, **fixed)
    for i in range(3):
        par = ParallelSpec(fsdp=8, ep=8, framework="fsdp2",
                           **{k: float(v[i]) for k, v in grid.items()})  # fmt: skip
        one = estimate(MIXTRAL, TrainSpec(batch=64, seq=4096), par, H100)
        for key in keys:
            assert got[key][i] == pytest.approx(float(one[key]), rel=1e-12), (i, key)


@pytest.mark.parametrize(
    ("model", "capacity", "message"),
    [("mixtral-8x7b", 0.5, r"capacity_factor must be 0 \(dropless\) or >= 1 \(got 0.5\)"),
     ("llama3-8b", 1.25, "capacity_factor needs a mixture-of-experts model")],
)  # fmt: skip
def test_bad_capacity_names_the_field(model, capacity, message):
    with pytest.raises(SpecError, match=message) as err:
        estimate(get_model(model), TRAIN, ParallelSpec(capacity_factor=capacity), H100)
    assert err.value.field == "capacity_factor"


def test_ddp_buckets_leave_out_experts_no_other_rank_holds():
    """The reference framework under DDP: a routed expert's gradient is bucketed only where
    another replica holds the same expert (dp 4, ep 2: two copies of each)."""
    train = TRAIN.replace(batch=8, grad_accum=1)
    dense = 4 * (N - EXPERTS)
    assert _mem(_values(ParallelSpec(dp=2, ep=2), train), "buffers") == dense
    both = _mem(_values(ParallelSpec(dp=4, ep=2), train), "buffers")
    assert both == dense + 4 * EXPERTS // 2


def test_sweep_over_ep_agrees_with_estimate():
    eps = np.array([1, 2, 4, 8])
    got = sweep(MIXTRAL, quantities=("time_s.step", "comm_bytes.ep"), hardware=H100,
                fsdp=8, framework="fsdp2", ep=eps, batch=64, seq=4096, micro_batch=1,
                recompute="full")  # fmt: skip
    for i, ep in enumerate(eps):
        want = _values(ParallelSpec(fsdp=8, ep=int(ep), framework="fsdp2"))
        assert got["time_s.step"][i] == pytest.approx(want["time_s.step"], rel=1e-9)


@pytest.mark.parametrize(
    ("par", "message"),
    [
        (ParallelSpec(fsdp=8, ep=3), r"ep must divide n_experts"),
        (ParallelSpec(fsdp=6, dp=2, ep=4), r"ep must divide the ZeRO shard group or be a mul"),
        (ParallelSpec(fsdp=2, ep=8), r"ep \* etp must divide tp \* dp \* fsdp \* cp"),
    ],
)
def test_bad_expert_parallel_layouts_name_ep(par, message):
    with pytest.raises(SpecError, match=message) as err:
        estimate(MIXTRAL, TrainSpec(batch=24, seq=4096), par, H100)
    assert err.value.field == "ep"


def test_ep_needs_experts_and_a_sane_imbalance():
    with pytest.raises(SpecError, match="ep > 1 needs a mixture-of-experts model") as err:
        estimate(get_model("mistral-7b"), TrainSpec(batch=8, seq=4096), ParallelSpec(fsdp=8, ep=2))
    assert err.value.field == "ep"
    with pytest.raises(SpecError, match=r"ep_imbalance .* must be >= 1 \(got 0.5\)") as err:
        ParallelSpec(ep_imbalance=0.5)
    assert err.value.field == "ep_imbalance"


# the hand-written expert parallelism on gloo


@pytest.mark.parametrize("shared", [1, 0])
def test_expert_parallel_training_equals_the_whole_model(shared):
    spec = LayoutCase("ep", experts=4).spec().replace(n_shared_experts=shared)
    for diffs in launch(model_check, 2, spec, backend="gloo", timeout_s=300):
        assert diffs["loss"] < 1e-5 and diffs["grads"] < 1e-6, diffs


def test_busiest_rank_holds_what_its_measured_imbalance_says():
    """Top-k routing sends one rank more pairs than the other; stated as ``ep_imbalance``
    (the pairs it received over those its tokens made), costmodel's after-forward bytes
    of that rank are within 0.2 % (its experts' inputs and hidden activations scale;
    the rest of what it keeps does not). Each rank's smaller bytes of two runs: gloo's
    worker threads now and then release an all-to-all's buffer after the forward returns
    (``measure_least``)."""
    case = LayoutCase("ep", experts=4, routing="topk")
    results = launch(measure_least, 2, case, 2, backend="gloo", timeout_s=600)
    busiest = max(results, key=lambda r: r["imbalance"])
    assert busiest["imbalance"] > 1.0  # real routing is not balanced
    par = case.parallel().replace(ep_imbalance=busiest["imbalance"])
    pred = predicted(case, estimate(case.spec(), case.train(), par, get_hardware("cpu")).values)
    assert abs(pred["after_forward"] / busiest["after_forward"] - 1) < 2e-3


def test_capacity_drops_what_the_busiest_rank_would_run_past_it():
    """Every pair routed to the first rank's experts (ep_imbalance 2 on 2 ranks), each
    source dropping an expert's pairs past capacity 1.5 before dispatch: that rank runs
    exactly 1.5x the pairs its own tokens made, the other none, and costmodel's
    after-forward bytes of the busiest rank at imbalance 2 and capacity 1.5 are within
    0.2 % of what it holds (the uncapped prediction is 10x further off)."""
    case = LayoutCase("ep", experts=4, routing="one-rank", capacity=1.5)
    busiest, other = sorted(launch(measure_least, 2, case, 2, backend="gloo", timeout_s=600),
                            key=lambda r: -r["imbalance"])  # fmt: skip
    assert busiest["imbalance"] == 1.5 and other["imbalance"] == 0
    cpu = get_hardware("cpu")
    par = case.parallel().replace(ep_imbalance=2.0)
    pred = predicted(case, estimate(case.spec(), case.train(), par, cpu).values)
    err = abs(pred["after_forward"] / busiest["after_forward"] - 1)
    uncapped = predicted(case, estimate(case.spec(), case.train(),
                                        par.replace(capacity_factor=0.0), cpu).values)  # fmt: skip
    assert err < 2e-3
    assert abs(uncapped["after_forward"] / busiest["after_forward"] - 1) > 10 * err


def test_smallest_fsdp_degree_keeps_to_the_degrees_ep_allows():
    """ep's ranks are data-parallel ranks: with ep 8 and no other data parallelism only
    FSDP degrees that are multiples of 8 are layouts, and the search skips the others."""
    from costmodel.engine.inverse import min_fsdp_fitting

    par = ParallelSpec(fsdp=8, ep=8, framework="fsdp2")
    found = min_fsdp_fitting(MIXTRAL, TrainSpec(batch=8, seq=4096, recompute="full"), par, H100)
    assert found["fsdp"] is not None and found["fsdp"] % 8 == 0
    assert found["per_device_bytes"] <= H100.hbm_bytes


def test_the_planner_searches_expert_parallel_degrees():
    from costmodel.engine.plan import PlanOptions, layout_label, plan

    options = PlanOptions(frameworks=("fsdp2",), recompute=("full",), micro_batches=(1,))
    found = plan(MIXTRAL, TrainSpec(batch=32, seq=4096), H100, 16, options)
    eps = set(found.columns["ep"][found.fits].tolist())
    assert {1, 2, 4, 8} <= eps  # 16 data ranks: every divisor of the 8 experts
    best = found.top(1)[0]
    assert best["ep"] > 1 and f" ep{best['ep']} " in layout_label(best)
    dense = plan(get_model("mistral-7b"), TrainSpec(batch=32, seq=4096), H100, 16, options)
    assert set(dense.columns["ep"].tolist()) == {1}


def _rank_values(model, train, par, index, first, last):

    from costmodel.engine.estimate import symbol_values
    from costmodel.frameworks import framework_of
    from costmodel.parallel.distributed import rank_memory
    from costmodel.parallel.pipeline import PipelineRank

    values = symbol_values(model, train, par, H100)
    rank = PipelineRank(index, first, last)
    memory = rank_memory(model, train, par, rank, pricing=framework_of(par))
    return {k: float(e.xreplace(by_symbol(values))) for k, e in memory.items()}


@pytest.mark.parametrize("ep", [1, 8])
def test_pipeline_ranks_split_the_model_and_ep_its_experts(ep):
    """Megatron, pp 4 over Mixtral's 32 blocks (8 a stage), ep 8 over its 8 data-parallel
    ranks: the four ranks' bf16 weights add up to the model's, less the 7/8 of every
    block's experts the other ep ranks hold (ranks 1 and 2 hold the same)."""
    train, par = (
        TrainSpec(batch=64, seq=4096, grad_accum=8),
        ParallelSpec(dp=8, pp=4, ep=ep, framework="megatron"),
    )
    ranks = [_rank_values(MIXTRAL, train, par, i, i == 0, i == 3) for i in (0, 1, 3)]
    held = ranks[0]["params"] + 2 * ranks[1]["params"] + ranks[2]["params"]
    assert held == 2 * (N - EXPERTS * (ep - 1) // ep)


def test_dense_leading_blocks_sit_on_the_stages_that_hold_them():
    """DeepSeekMoE-16B (its first block dense) over 4 stages of 7 blocks: the first rank
    holds the dense block and 6 MoE blocks, the others 7 MoE blocks; with 8 dense blocks
    the second rank holds one of them (refused before: they had to fit on the first
    stage). Dense blocks beyond the first round of interleaved stages are refused, naming
    pp."""
    model = get_model("deepseek-moe-16b")
    train, par = (
        TrainSpec(batch=64, seq=4096, grad_accum=8),
        ParallelSpec(dp=8, pp=4, framework="megatron"),
    )
    sizes = values_for(model)
    parts = {k: int(e.subs(sizes)) for k, e in param_breakdown(model).items()}
    moe_block = (parts["router"] + parts["experts"] + parts["shared_experts"]) // 27
    first, second = (_rank_values(model, train, par, i, i == 0, False) for i in (0, 1))
    dense_ffn = parts["ffn"]  # the one dense block's FFN
    embedding = parts["embedding"]
    assert (first["params"] - second["params"]) / 2 == embedding + dense_ffn - moe_block
    eight = model.replace(dense_layers=8)
    second_of_eight = _rank_values(eight, train, par, 1, False, False)
    assert (second_of_eight["params"] - second["params"]) / 2 == dense_ffn - moe_block
    interleaved = par.replace(pp_interleave=2)  # 8 stages of 4 then 3: the first 4 hold 16
    estimate(model.replace(dense_layers=16), train, interleaved, H100)
    with pytest.raises(SpecError, match="dense leading blocks must lie within the first") as err:
        estimate(model.replace(dense_layers=17), train, interleaved, H100)
    assert err.value.field == "pp"
