"""Parallel layouts: hand-derived values, limits, monotonicity, CLI (issue 3)."""

from __future__ import annotations

import itertools
import json

import pytest

from costmodel import TrainSpec, estimate, get_model
from costmodel.book.bounds import bounds_report
from costmodel.book.fsdp import min_fsdp
from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.cli import main
from costmodel.parallel.layout import group_links
from costmodel.specs.parallel import ParallelSpec

H100 = get_hardware("h100-sxm")
TPU = get_hardware("tpu-v5p")


def est(model="cs336-small", train=None, hw=H100, **layout):
    train = train or TrainSpec(batch=16, seq=512)
    return estimate(get_model(model), train, ParallelSpec(**layout), hw).values


@pytest.mark.parametrize("name", ["cs336-small", "gpt2", "llama3-8b", "xxl"])
def test_one_device_layout_equals_single_device_memory(name):
    train = TrainSpec(batch=4, seq=256)
    single = estimate(get_model(name), train).values
    layout = est(name, train)
    for key in ("params", "master", "grads", "optimizer", "activations", "peak"):
        assert layout[f"memory_bytes_per_device.{key}"] == pytest.approx(
            single[f"memory_bytes.{key}"], rel=1e-12
        ), key


def test_zero_stages_shard_what_they_promise():
    # ZeRO (Rajbhandari et al. 2020, Fig. 1): stage 1 optimizer, 2 + gradients, 3 + weights.
    one = est(fsdp=1)
    for stage, sharded in (
        (1, {"optimizer"}),
        (2, {"optimizer", "grads"}),
        (3, {"optimizer", "grads", "params", "master"}),
    ):
        v = est(fsdp=8, zero=stage)
        for key in ("optimizer", "grads", "params", "master"):
            want = one[f"memory_bytes_per_device.{key}"] / (8 if key in sharded else 1)
            assert v[f"memory_bytes_per_device.{key}"] == pytest.approx(want), (stage, key)


def test_dp_all_reduce_moves_two_n_minus_one_over_n():
    # Ring all-reduce of the reference's fp32 gradients (torch.autocast keeps fp32
    # parameters; DDP reduces .grad as it is): 2·(N-1)/N · 4 bytes · params per device.
    v = est(dp=4)
    n = estimate(get_model("cs336-small"), TrainSpec()).values["params.total"]
    assert v["comm_bytes.dp"] == pytest.approx(2 * 3 / 4 * 4 * n)
    assert est(dp=4, grad_reduce_fp32=False)["comm_bytes.dp"] == pytest.approx(2 * 3 / 4 * 2 * n)


def test_fsdp_moves_gather_twice_and_reduce_scatter_once():
    # ZeRO-3: AllGather forward + AllGather backward of bf16 weights, then a ReduceScatter
    # of the reference's fp32 gradients, each (X-1)/X of their bytes.
    v = est(fsdp=8)
    n = estimate(get_model("cs336-small"), TrainSpec()).values["params.total"]
    assert v["comm_bytes.fsdp"] == pytest.approx(7 / 8 * (2 * 2 + 4) * n)


def test_tp_all_reduces_per_layer():
    # Megatron: 2 all-reduces per layer forward, 2 backward, of b·T·D bf16 activations each;
    # the vocab-parallel embedding's forward one (fp32 residual under autocast), the head
    # input gradient's backward one (bf16) and the loss's three fp32 per-token scalars.
    b, t, d, layers = 16, 512, 768, 12
    ring = 2 * 3 / 4  # all-reduce bytes per byte over 4 ranks
    blocks = 4 * layers * ring * 2 * b * t * d
    vocab = ring * (4 * b * t * d + 2 * b * t * d + 3 * 4 * b * t)
    v = est(tp=4)
    assert v["comm_bytes.tp"] == pytest.approx(blocks + vocab)
    sp = est(tp=4, sequence_parallel=True)  # reduce-scatter + all-gather: the same bytes
    assert sp["comm_bytes.tp"] == pytest.approx(blocks + vocab)


def test_tp_shards_activations_as_korthikanti_table2():
    # Without SP the attention core, its output and the FFN hidden divide by t; with SP all
    # but the column-parallel matmul inputs, which torch's DTensor saves all-gathered.
    train = TrainSpec(batch=4, seq=512, attention="naive")
    single = estimate(get_model("cs336-small"), train).values
    by_op = {
        k.rsplit(".", 1)[1]: x
        for k, x in single.items()
        if k.startswith("memory_bytes.activations_by_op.")
    }
    sharded = ("attention", "attn_out_input", "ffn_hidden", "loss")
    constants = ("inputs", "rope", "attn_mask")
    gathered = ("attn_input", "ffn_input", "lm_head_input")  # DTensor saves them whole
    embed = 4 * 4 * 512 * 768  # fp32 b·T·D: torch's vocab-parallel embedding buffers
    expected = sum(x / 4 if k in sharded else x for k, x in by_op.items()) + 2 * embed
    assert est(train=train, tp=4)["memory_bytes_per_device.activations"] == pytest.approx(expected)
    expected_sp = sum(x if k in constants else x / 4 for k, x in by_op.items())
    expected_sp += sum(x * 3 / 4 for k, x in by_op.items() if k in gathered) + 3 / 4 * embed
    got = est(train=train, tp=4, sequence_parallel=True)["memory_bytes_per_device.activations"]
    assert got == pytest.approx(expected_sp)


def test_pipeline_bubble_is_p_minus_one_over_m():
    train = TrainSpec(batch=16, seq=512, grad_accum=8)
    v = est(train=train, pp=4)
    assert v["time_s.bubble"] == pytest.approx(v["time_s.compute"] * 3 / 8)
    vi = est(train=train, pp=4, pp_interleave=3)
    assert vi["time_s.bubble"] == pytest.approx(vi["time_s.compute"] * 3 / (3 * 8))


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_more_fsdp_never_raises_state_memory(zero):
    keys = ("params", "master", "grads", "optimizer")
    totals = [
        sum(est(fsdp=x, zero=zero)[f"memory_bytes_per_device.{k}"] for k in keys)
        for x in (1, 2, 4, 8, 16)
    ]
    assert all(a >= b for a, b in itertools.pairwise(totals))


def test_sum_overlap_costs_at_most_the_communication():
    # Per phase, sum - max = min(compute, overlappable comm), so 0 <= step_sum - step_max <=
    # total comm; TP collectives are exposed under both rules (unless async TP).
    for layout in ({"fsdp": 8}, {"tp": 4, "async_tp": True}, {"dp": 2, "fsdp": 4}):
        fast, slow = est(overlap="max", **layout), est(overlap="sum", **layout)
        extra = slow["time_s.step"] - fast["time_s.step"]
        assert 0 < extra <= fast["time_s.comm"] * (1 + 1e-12)
    fast, slow = est(overlap="max", tp=4), est(overlap="sum", tp=4)
    assert slow["time_s.step"] == pytest.approx(fast["time_s.step"], rel=1e-12)


def test_mfu_definition():
    v = est(fsdp=8)
    useful = estimate(get_model("cs336-small"), TrainSpec(batch=16, seq=512)).values[
        "flops.conventions.useful"
    ]
    assert v["mfu"] == pytest.approx(useful / (v["time_s.step"] * 989.4e12 * 8))
    assert 0 < v["mfu"] < v["hfu"] <= 1


def test_hfu_counts_the_flops_kernels_execute():
    """The naive core runs every score: HFU's FLOPs are flops.step. flops.step counts a flash
    core dense, forward and 2.5x backward (it recomputes QKᵀ); a causal one skips the masked
    half of both. Full recompute adds a forward of every layer (not the head)."""
    peak = H100.peak("bf16")

    def executed(attention, recompute="none"):
        train = TrainSpec(batch=2, seq=8192, attention=attention, recompute=recompute)
        v = est(train=train)
        return v["hfu"] * v["time_s.step"] * peak, v

    naive, v = executed("naive")
    assert naive == pytest.approx(v["flops.step"], rel=1e-12)
    flash, v = executed("flash")
    core = v["flops.forward_by_op.attn_scores"] + v["flops.forward_by_op.attn_values"]
    assert flash == pytest.approx(v["flops.step"] - core * 3.5 / 2, rel=1e-12)
    full, v = executed("flash", "full")
    head = v["flops.forward_by_op.lm_head"]
    assert full == pytest.approx(flash + v["flops.forward"] - head - core / 2, rel=1e-12)


@pytest.mark.parametrize("hw", ["h100-sxm", "a100-80gb", "tpu-v5p", "cpu"])
@pytest.mark.parametrize("attention", ["flash", "naive"])
def test_hfu_at_most_one_at_long_sequences(hw, attention):
    """Found by fuzzing: HFU counted dense causal attention, 114 % at seq 65,536 on A100."""
    precision = "fp32" if hw == "cpu" else "bf16-mixed"
    for recompute, seq in itertools.product(("none", "full", "selective-op"), (4096, 65536)):
        train = TrainSpec(batch=1, seq=seq, attention=attention, recompute=recompute,
                          precision=precision)  # fmt: skip
        v = est(train=train, hw=get_hardware(hw))
        assert 0 < v["mfu"] <= v["hfu"] <= 1, (recompute, seq)


def test_placement_uses_nvlink_inside_a_node_and_network_across():
    links = group_links(ParallelSpec(tp=8, dp=2), H100)
    assert links["tp"][0] == pytest.approx(450e9 * 0.8)
    assert links["dp"][0] == pytest.approx(50e9 * 0.8)  # one member per node: one NIC
    wide = group_links(ParallelSpec(tp=2, fsdp=16), H100)  # 4 members per node: 4 NICs
    assert wide["fsdp"][0] == pytest.approx(4 * 50e9 * 0.8)
    tpu = group_links(ParallelSpec(fsdp=16, tp=4, mx=2), get_hardware("tpu-v5p"))
    assert tpu["fsdp"][0] == pytest.approx(2 * 1.8e11 * 0.9)


def test_xxl_critical_batch_by_hand():
    # Forward only, T_math = 4BDFL/(XYC), T_fsdp = 4DFL/(Y·W·M_X), T_tp = 4BDL/(X·W·M_Y).
    # T_math = T_fsdp + T_tp  =>  B = (F/(Y·W·M_X)) / (F/(N·C) - 1/(X·W·M_Y)).
    c, w, x, y, f = 4.6e14, 2 * 9e10, 16, 4, 53248
    expected = (f / (y * w * 2)) / (f / (x * y * c) - 1 / (x * w * 1))
    r = bounds_report(
        get_model("xxl"),
        ParallelSpec(fsdp=x, tp=y, mx=2, my=1, overlap="max"),
        TPU,
        peak_flops=c,
        bandwidth=w,
        forward_only=True,
    )
    assert r["critical_batch_tokens"] == pytest.approx(expected, rel=1e-12)
    assert r["critical_batch_tokens_per_device"] == pytest.approx(expected / 64)
    t = r["time_s_at_critical_batch"]
    assert t["math"] == pytest.approx(t["fsdp"] + t["tp"])


def test_book_takeaways():
    # Scaling Book ch. 5: FSDP-bound below C/W = 2550 tokens per device on one v5p axis;
    # TP up to Y < F/2550; mixed down to 2·2550²/F per device (M_X = 2, M_Y = 1).
    model = get_model("xxl")
    r = bounds_report(
        model,
        ParallelSpec(fsdp=8, tp=1, mx=1, my=1, overlap="max"),
        TPU,
        peak_flops=4.59e14,
        bandwidth=1.8e11,
        forward_only=True,
    )
    assert r["conditions"]["fsdp_min_batch_per_device"] == pytest.approx(2550)
    assert r["conditions"]["tp_max_degree"] == pytest.approx(53248 / 2550)
    r2 = bounds_report(
        model,
        ParallelSpec(fsdp=8, tp=2, mx=2, my=1, overlap="sum"),
        TPU,
        peak_flops=4.59e14,
        bandwidth=1.8e11,
        forward_only=True,
    )
    assert r2["conditions"]["mixed_min_batch_per_device"] == pytest.approx(2 * 2550**2 / 53248)
    t = r2["time_s_at_critical_batch"]
    assert t["step"] == pytest.approx(2 * t["math"])  # sum rule: no overlap


def test_min_fsdp_closed_form_by_hand():
    # XXL bf16-mixed: 18 bytes per parameter of state (2 bf16 copy + 4 master + 4 grad + 8
    # Adam); activations per token (ReLU FFN): L·2·(D+F) bytes + the fp32 input 4·D.
    model, train = get_model("xxl"), TrainSpec(batch=1, seq=8192)
    n = 126 * 2 * 16384 * 53248
    acts = 8192 * (126 * 2 * (16384 + 53248) + 4 * 16384)
    r = min_fsdp(model, train, 95e9, 8192, 0.5)
    assert r["state_bytes"] == 18 * n and r["activation_bytes"] == acts
    exact = (18 * n + 0.5 * acts) / (95e9 - 0.5 * acts)
    assert r["fsdp_exact"] == pytest.approx(exact) and r["fsdp"] == 177
    assert r["per_device_bytes"] <= 95e9


def test_min_fsdp_infeasible_is_a_clear_error():
    with pytest.raises(ValueError, match="unsharded activations alone"):
        min_fsdp(get_model("xxl"), TrainSpec(batch=1, seq=8192), 50e9, 8 * 8192, 0.5)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"tp": 5}, "tp must divide n_heads"),
        ({"pp": 1024}, "pp \\* pp_interleave must be <= n_layers"),
        ({"cp": 3}, "cp must divide seq"),
        ({"zero": 4}, "zero must be one of 1, 2, 3"),
        ({"overlap": "some"}, "overlap must be one of max, sum"),
        ({"dp": 3}, "dp \\* fsdp \\* grad_accum must divide batch"),
    ],
)
def test_bad_layouts(layout, message):
    with pytest.raises(ValueError, match=message):
        est(**layout)


def test_hardware_catalog_is_valid_and_profiles_load(tmp_path):
    for name in HARDWARE:  # every accelerator has a 16-bit peak (V100: fp16 only)
        hw = get_hardware(name)
        assert (
            hw.peak("fp32" if name == "cpu" else "fp16" if name.startswith("v100") else "bf16") > 0
        )
    with pytest.raises(ValueError, match="has no bf16 peak"):
        get_hardware("v100-sxm2-32gb").peak("bf16")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**HARDWARE["h100-sxm"], "hbm_bw": 1e12}))
    assert get_hardware(str(path)).hbm_bw == 1e12
    with pytest.raises(ValueError, match="has no fp8 peak"):
        get_hardware("a100-80gb").peak("fp8")
    path.write_text(json.dumps({"kind": "gpu"}))
    with pytest.raises(ValueError, match="missing field"):
        get_hardware(str(path))


def test_cli_estimate_with_layout(capsys):
    argv = [
        "estimate",
        "--model",
        "llama3-8b",
        "--seq",
        "8192",
        "--batch",
        "128",
        "--hardware",
        "h100-sxm",
        "--gpus",
        "8",
        "--cp",
        "2",
        "--microbatch",
        "1",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["dp"] == 4 and out["train"]["grad_accum"] == 32
    for key in ("forward", "backward", "optimizer", "step"):
        assert out["time_s"][key] > 0
    assert out["tokens_per_s"] > 0 and "cp" in out["comm_bytes"]
    # an MFU only for a layout that fits (this one's 8,192-token sequences do not)
    assert (0 < out["mfu"] < 1) if out["verdict"]["fits"] else out["mfu"] is None


def test_cli_bounds_and_solve(capsys):
    assert (
        main(
            [
                "bounds",
                "--model",
                "xxl",
                "--hardware",
                "tpu-v5p",
                "--fsdp",
                "16",
                "--tp",
                "4",
                "--mx",
                "2",
                "--my",
                "1",
                "--overlap",
                "max",
                "--forward-only",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["critical_batch_tokens"] > 0 and out["critical_batch_tokens_per_device"] > 0
    assert (
        main(
            ["solve", "min-fsdp", "--model", "xxl", "--budget-gb", "95", "--seq", "8192", "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["book"]["fsdp"] == 177


def test_cli_overlap_flag(capsys):
    base = [
        "estimate",
        "--model",
        "cs336-small",
        "--hardware",
        "h100-sxm",
        "--fsdp",
        "8",
        "--batch",
        "16",
        "--json",
    ]
    steps = {}
    for rule in ("max", "sum"):
        assert main([*base, "--overlap", rule]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["parallel"]["overlap"] == rule
        steps[rule] = out["time_s"]["step"]
    assert steps["sum"] > steps["max"]


def test_cli_layout_errors(capsys):
    assert main(["estimate", "--model", "gpt2", "--tp", "2"]) == 2
    assert "hardware is required with tp" in capsys.readouterr().err
    assert (
        main(["estimate", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus", "6", "--tp", "4"])
        == 2
    )
    assert "must divide --gpus" in capsys.readouterr().err


@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_recomputation_costs_time_on_a_layout(attention):
    """Full recomputation re-runs each block's forward, selective only the attention core."""
    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    par = ParallelSpec(fsdp=8)
    steps = {}
    for policy in ("none", "selective", "full"):
        train = TrainSpec(batch=8, seq=4096, attention=attention, recompute=policy)
        steps[policy] = estimate(model, train, par, hw)["time_s.backward"]
    assert steps["none"] < steps["selective"] < steps["full"]


def test_optimizer_temporary_is_the_devices_share():
    """Regression (issue 12): foreach Adam's sqrt(v) temporary was sized from the whole
    model, 692 GiB per device for GPT-3 175B at tp 8 x pp 8 on 64 A100s while the components
    summed to 81 GiB. It is one optimizer state of what the device holds; Narayanan et al.
    2021 (Table 1) trained this layout on 80 GB A100s with Megatron."""
    model = get_model("gpt3-175b")
    train = TrainSpec(batch=64, seq=2048, precision="fp16-mixed", grad_accum=64)
    v = estimate(model, train, ParallelSpec(tp=8, pp=8), get_hardware("a100-80gb")).values
    per = "memory_bytes_per_device."
    state = v[per + "master"] + v[per + "grads"] + v[per + "optimizer"]
    expected = max(v[per + "peak_forward_backward"] + v[per + "optimizer"],
                   state + v[per + "optimizer"] / 2)  # fmt: skip
    assert v[per + "peak"] == pytest.approx(expected, rel=1e-12)
    megatron = ParallelSpec(tp=8, pp=8, framework="megatron")
    assert estimate(model, train, megatron, get_hardware("a100-80gb"))[per + "peak"] < 80 * 2**30


@pytest.mark.parametrize(("pp", "in_flight"), [(1, 2), (2, 2), (4, 1)])
def test_zero3_gathers_two_layers_or_the_stage(pp, in_flight):
    """Found by fuzzing: ZeRO-3's running and prefetched layers were two even on a stage of
    one layer. Bytes beyond the shard: in flight x bf16 x the stage's matmul weights per
    layer (the head's share included: the last stage is the busiest) x 1/2."""
    from costmodel.parallel.distributed import zero3_gathered
    from costmodel.parallel.layout import layout_values
    from costmodel.symbols import values_for

    model, train = get_model("cs336-small", n_layers=4), TrainSpec(batch=8, seq=256)
    par = ParallelSpec(fsdp=2, pp=pp, zero=3)
    values = {**values_for(model, train), **layout_values(train, par, H100)}
    value = zero3_gathered(model, train, par).subs(values)
    D, F, layers = model.d_model, model.d_ff, 4 // pp
    per_layer = (layers * (4 * D * D + 3 * D * F) + model.vocab * D) / layers
    assert float(value) == in_flight * 2 * per_layer / 2


def test_max_seq_says_when_it_stops_at_its_limit(capsys):
    """Found by a new user: solve max-seq returned 2^24 without a word when more fits (a
    sequence over 1,024 context-parallel ranks: 16k tokens a device)."""
    assert main(["solve", "max-seq", "--model", "cs336-small", "--hardware", "h100-sxm",
                 "--gpus", "1024", "--cp", "1024", "--recompute", "full"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith(
        "answer   seq 16,777,216: the search limit, 16,777,216, whose per-device peak fits"
    )  # the bound, not the budget, set it
    assert "seq reached the search limit, 16,777,216" in out
    assert main(["solve", "max-seq", "--model", "gpt2", "--hardware", "h100-sxm",
                 "--budget-gb", "80", "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert result["seq"] == 1024 and "1,024 learned positions" in result["limited_by"]
    assert main(["solve", "max-seq", "--model", "llama3-8b", "--hardware", "h100-sxm",
                 "--json"]) == 0  # fmt: skip
    assert "limited_by" not in json.loads(capsys.readouterr().out)
