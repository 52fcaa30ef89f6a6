"""Inputs a newcomer's probe found taken without a word (issue 60's third probe): each is
now refused in one line naming its field, or answered as the question states it."""

from __future__ import annotations

import argparse
import json

import pytest

import costmodel
from costmodel import ParallelSpec, TrainSpec, estimate, get_model
from costmodel.catalog.hardware import HARDWARE, get_hardware, hardware_from_dict
from costmodel.cli import main, make_parser
from costmodel.engine.nearest import nearest_fit
from costmodel.specs.checks import SpecError
from costmodel.specs.offload import OffloadSpec
from validate.published.__main__ import main as published_main

H100 = get_hardware("h100-sxm")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: costmodel.sweep("gpt2", hardware=["h100-sxm", "a100-80gb"], batch=4, seq=128),
         "hardware"),
        (lambda: costmodel.sweep(["gpt2", "llama3-8b"], batch=4, seq=128), "model"),
        (lambda: costmodel.plan("gpt2", hardware="h100-sxm", gpus=7.5, batch=8), "gpus"),
        (lambda: costmodel.plan("gpt2", hardware="h100-sxm", gpus=8, batch=8, progress="yes"),
         "progress"),
        (lambda: costmodel.plan("gpt2", hardware="h100-sxm", gpus=8, batch=8,
                                framework="fsdp2", frameworks=["megatron"]), "framework"),
        (lambda: costmodel.estimate("llama3-8b", batch=4, seq=128, lora_rank=8), "lora_rank"),
        (lambda: costmodel.serve("llama3-8b", input=100, output=10, draft_layers=2),
         "draft_layers"),
        (lambda: ParallelSpec(bucket_mb=1e-300), "bucket_mb"),
    ],
)  # fmt: skip
def test_a_bad_api_input_is_one_error_naming_its_field(call, field):
    with pytest.raises(SpecError) as err:
        call()
    assert err.value.field == field


def test_one_quantity_by_name_is_that_quantity_not_its_letters():
    table = costmodel.sweep("gpt2", hardware="h100-sxm", quantities="time_s.step", batch=[4, 8],
                            seq=128)  # fmt: skip
    assert "time_s.step" in table and len(table["time_s.step"]) == 2


def test_the_busiest_rank_holds_at_most_every_pair():
    mixtral, train = get_model("mixtral-8x7b"), TrainSpec(batch=8, seq=1024)
    estimate(mixtral, train, ParallelSpec(fsdp=8, ep=8, ep_imbalance=8.0), H100)  # all on one
    with pytest.raises(SpecError, match=r"at most ep, .*ep_imbalance=8.5, ep=8") as err:
        estimate(mixtral, train, ParallelSpec(fsdp=8, ep=8, ep_imbalance=8.5), H100)
    assert err.value.field == "ep_imbalance"


def test_json_says_null_where_the_text_says_none(capsys):
    """tp 64 on the XXL model is never compute-bound: no critical batch (infinite), which
    --json wrote as a JSON error instead of an answer."""
    assert main(["bounds", "--model", "xxl", "--hardware", "tpu-v5p", "--fsdp", "1", "--tp", "64",
                 "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["critical_batch_tokens"] is None


def test_formula_and_json_are_one_or_the_other(capsys):
    argv = ["estimate", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus", "8", "--seq",
            "1024", "--batch", "64", "--json", "--formula", "mfu"]  # fmt: skip
    assert main(argv) == 2
    assert "give one of them" in capsys.readouterr().err


def test_a_corpus_with_nothing_predicted_fails_and_ids_are_unique(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": [{"id": "x"}]}))
    assert published_main(["--runs", str(bad), "--out", str(tmp_path / "a")]) == 1
    assert "none of the 1 runs could be predicted" in capsys.readouterr().err
    bad.write_text(json.dumps({"runs": [{"id": "x"}, {"id": "x"}]}))
    assert published_main(["--runs", str(bad), "--out", str(tmp_path / "b")]) == 2
    assert "each id once (twice or more: x)" in capsys.readouterr().err


def test_the_planners_way_out_is_priced_with_the_users_other_inputs():
    """The planner does not search ep_imbalance: its layout is priced again with the
    user's, so the numbers quoted are the ones that layout gets when run as suggested."""
    mixtral = get_model("mixtral-8x7b")
    train = TrainSpec(batch=8, seq=4096, grad_accum=1)
    est = estimate(mixtral, train, ParallelSpec(fsdp=8, ep=8, ep_imbalance=2.0), H100)
    answer = nearest_fit(est)
    assert answer is not None and "planner" in answer["change"]
    inputs = {"hardware": "h100-sxm", "gpus": 8, "fsdp": 8, "ep": 8, "seq": 4096, "batch": 8,
              "ep_imbalance": 2.0, **answer["inputs"]}  # fmt: skip
    rerun = costmodel.estimate("mixtral-8x7b", **inputs)
    assert rerun["time_s.step"] == pytest.approx(answer["step_s"], rel=1e-9)
    assert rerun["memory_bytes_per_device.peak"] == pytest.approx(answer["peak_bytes"], rel=1e-9)


def test_bounds_splits_the_layers_over_tp_as_estimate_does(capsys):
    argv = ["bounds", "--model", "xxl", "--hardware", "tpu-v5p", "--fsdp", "16", "--tp", "3"]
    assert main(argv) == 2
    assert "--tp must divide --d-ff (got --d-ff=53248, --tp=3)" in capsys.readouterr().err


def test_mxfp4_on_a_device_without_bf16_says_why_bf16(capsys):
    argv = ["serve", "--model", "llama3-8b", "--precision", "mxfp4", "--hardware",
            "v100-sxm2-32gb", "--input", "100", "--output", "10"]  # fmt: skip
    assert main(argv) == 2
    assert "dequantized to bf16 matmuls" in capsys.readouterr().err


def test_a_profiles_attention_rate_does_not_hide_its_peak_of_the_same_dtype():
    """The peak and attention tables were checked as one merged dict, so an attention_flops
    entry replaced the peak_flops entry of its dtype: a negative bf16 peak was taken."""
    cpu = HARDWARE["cpu"]
    bad = {**cpu, "peak_flops": {**cpu["peak_flops"], "bf16": -1.0}}
    assert "bf16" in cpu["attention_flops"]
    with pytest.raises(SpecError, match=r"peak_flops\.bf16 must be > 0 \(got -1\.0\)") as err:
        hardware_from_dict("bad", bad)
    assert err.value.field == "peak_flops.bf16"


@pytest.mark.parametrize(
    ("change", "field", "phrase"),
    [
        ({"hbm_bytes": 1e308}, "hbm_bytes", "hbm_bytes must be <= 1,125,899,906,842,624 bytes "
         "(1 PiB) (got hbm_bytes=1e+308)"),
        ({"hbm_bw": 2e17}, "hbm_bw", "hbm_bw must be <= 1e+17 bytes/s"),
        ({"network_bw": 1e300}, "network_bw", "network_bw must be <= 1e+17 bytes/s"),
        ({"peak_flops": {"bf16": 1e19}}, "peak_flops", "peak_flops.bf16 must be <= 1e+18 FLOP/s"),
        ({"link_latency_s": 3.0}, "link_latency_s", "link_latency_s must be <= 1 s"),
        ({"devices_per_node": 2**17}, "devices_per_node",
         "devices_per_node must be <= 65,536 devices"),
        ({"gemm_tile": [256, 2**20]}, "gemm_tile", "gemm_tile.cols must be <= 65,536"),
        ({"power_w": 1e9}, "power_w", "power_w must be <= 1,000,000 W"),
        ({"gemm_half_depth": {"fp8": 1e300}}, "gemm_half_depth",
         "gemm_half_depth.fp8 must be <= 4,294,967,296"),
    ],
)  # fmt: skip
def test_a_profile_states_no_more_than_any_device_could_have(change, field, phrase):
    """A probe: a profile of hbm_bytes 1e308 was taken, and every model "fit" in its
    memory; each number now has a bound no device built or announced comes near."""
    with pytest.raises(SpecError) as err:
        hardware_from_dict("bad", {**HARDWARE["h100-sxm"], **change})
    assert err.value.field == field and phrase in str(err.value), str(err.value)


def test_every_catalog_profile_is_within_the_bounds_and_the_cli_names_the_field(tmp_path, capsys):
    for name in HARDWARE:
        get_hardware(name)
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({**HARDWARE["h100-sxm"], "hbm_bytes": 1e308}))
    assert main(["estimate", "--model", "gpt2", "--hardware", str(path)]) == 2
    err = capsys.readouterr().err
    assert "hbm_bytes must be <= 1,125,899,906,842,624 bytes" in err and err.count("\n") == 1


def test_a_cache_block_is_at_most_what_any_engine_pages(capsys):
    """A probe: ``serve --block-size 1000000000`` sized every cache in blocks of a billion
    tokens (488,297 GiB a device) instead of refusing a page no engine uses."""
    argv = ["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--context", "4096",
            "--batch", "4", "--block-size"]  # fmt: skip
    assert main([*argv, "1000000000"]) == 2
    err = capsys.readouterr().err
    assert "--block-size must be <= 65,536 tokens" in err and err.count("\n") == 1, err
    assert main([*argv, "65536"]) == 0
    with pytest.raises(SpecError, match="block_size must be <= 65,536") as bad:
        costmodel.serve("llama3-8b", input=100, output=10, block_size=2**17)
    assert bad.value.field == "block_size"


def test_an_unknown_name_is_one_sentence_with_the_closest_known_names():
    """A probe: ``est[key]``, ``est.expr(key)`` and ``costmodel.symbol(name)`` each said
    an unknown name their own way (a few keys containing it, all 147 keys, all symbols).
    Each is now one KeyError sentence naming the key and the closest known ones."""
    est = costmodel.estimate("gpt2", batch=4, seq=128, hardware="h100-sxm")
    said = "unknown quantity 'time_s.stpe'; did you mean 'time_s.step'"
    for lookup in (lambda: est["time_s.stpe"], lambda: est.expr("time_s.stpe"),
                   lambda: est.evaluate("time_s.stpe")):  # fmt: skip
        with pytest.raises(KeyError) as err:
            lookup()
        assert str(err.value).startswith(said) and err.value.key == "time_s.stpe", err.value
    with pytest.raises(KeyError, match=r"^unknown symbol 'alpha_XX'; did you mean 'alpha_X'"):
        costmodel.symbol("alpha_XX")
    with pytest.raises(KeyError, match=r"^unknown quantity 'zzz'; est.keys\(\) lists them all$"):
        est.expr("zzz")
    plan = costmodel.plan("cs336-small", hardware="h100-sxm", gpus=2, batch=8, seq=512)
    with pytest.raises(KeyError, match=r"^unknown column 'mfuu'; did you mean 'mfu'"):
        plan["mfuu"]


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--link-gbps", "1e300", "--link-gbps must be <= 1,000,000 GB/s"),
        ("--link-gbps", "1e-300", "--link-gbps must be >= 1e-06 GB/s"),
        ("--nvme-gbps", "1e300", "--nvme-gbps must be <= 1,000,000 GB/s"),
        ("--host-budget-gb", "1e300", "--host-budget-gb must be <= 1,000,000 GB"),
    ],
)
def test_an_offload_rate_or_budget_past_any_machine_names_its_flag(capsys, flag, value, said):
    """A probe: ``offload --link-gbps 1e300`` said "link_bw must be finite (got inf)", an
    internal field and a value not given; ``--link-gbps 1e-300`` priced 1e300-second steps."""
    argv = ["offload", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq", "4096",
            "--batch", "8", "--device-budget-gb", "70", "--host-budget-gb", "500"]  # fmt: skip
    assert main([*argv, flag, value]) == 2
    err = capsys.readouterr().err
    assert said in err and f"{float(value):g})" in err, err  # the number given, not bytes
    assert err.count("\n") == 1 and "_bw" not in err


def test_an_offload_spec_bounds_its_rates_in_bytes():
    with pytest.raises(SpecError, match=r"link_bw must be <= 1,000,000,000,000,000 bytes/s"):
        OffloadSpec(device_budget=70e9, host_budget=500e9, link_bw=1e300)


def test_a_flag_is_its_whole_name_never_a_prefix_of_one(capsys):
    """A probe: ``--micro 2`` was taken as ``--microbatch 2`` (argparse takes a unique
    prefix by default), so a typo, or a flag of another command, was silently another."""
    argv = ["estimate", "--model", "gpt2", "--batch", "4", "--seq", "128", "--hardware",
            "h100-sxm", "--gpus", "2", "--json"]  # fmt: skip
    assert main([*argv, "--microbatch", "2"]) == 0
    capsys.readouterr()
    assert main([*argv, "--micro", "2"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --micro 2" in err and err.count("\n") == 1, err
    assert err.startswith("python -m costmodel estimate: error:")  # the subcommand's parser
    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert not make_parser().allow_abbrev
    assert not [name for name, parser in sub.choices.items() if parser.allow_abbrev]
    with pytest.raises(SystemExit) as done:
        published_main(["--run", "runs.json"])
    assert done.value.code == 2
    assert "unrecognized arguments: --run" in capsys.readouterr().err


@pytest.mark.parametrize("k", [-2, 1.5, True, "3"])
def test_a_plans_top_k_is_a_whole_number_of_rows(k):
    """A probe: ``plan.top(-2)`` returned every layout but the last two (a slice's
    reading of -2) instead of refusing a count of rows that is not one."""
    plan = costmodel.plan("cs336-small", hardware="h100-sxm", gpus=2, batch=8, seq=512)
    for rows in (plan.top, plan.table, plan.summary):
        with pytest.raises(SpecError, match=r"^k must be (>= 0|an integer)") as err:
            rows(k)
        assert err.value.field == "k"
    assert len(plan.top(0)) == 0 and len(plan.top(2)) == 2


def test_recompute_every_is_at_most_the_layers_it_picks_from(capsys):
    """A probe: ``--recompute-every 100`` on gpt2's 12 blocks was taken (checkpointing
    every 100th block of 12 is the first alone, which recompute_every 12 already says)."""
    argv = ["estimate", "--model", "gpt2", "--batch", "4", "--seq", "128", "--recompute",
            "full", "--recompute-every"]  # fmt: skip
    assert main([*argv, "100"]) == 2
    err = capsys.readouterr().err
    assert "--recompute-every must be <= --n-layers" in err, err
    assert "(got --recompute-every=100, --n-layers=12)" in err and err.count("\n") == 1
    assert main([*argv, "12"]) == 0
    with pytest.raises(SpecError, match="recompute_every must be <= n_layers") as bad:
        costmodel.sweep("gpt2", batch=4, seq=128, recompute="full", recompute_every=[2, 13])
    assert bad.value.field == "recompute_every"


@pytest.mark.parametrize(
    ("flags", "says"),
    [(["--hardware", "h100-sxm", "--gpus", "9007199254740992"],
      "data-parallel devices would take a default batch of 9,007,199,254,740,992"),
     (["--hardware", "h100-sxm", "--gpus", "8", "--token-budget", "1e30"],
      "--token-budget must be <= 1,000,000,000,000,000,000 tokens"),
     (["--hardware", "h100-sxm", "--gpus", "8", "--token-budget", "1e12", "--price-per-hour",
       "1e300"], "--price-per-hour must be <= 1,000,000 per device-hour"),
     (["--hardware", "h100"], "did you mean h100-sxm or h100-sxm-96gb or h100-pcie?"),
     (["--hardware", "h100-sxm", "--gpus", "8", "--batch", "8", "--microbatch", "3"],
      "--microbatch 3 x the 8 data-parallel devices (24) must divide --batch 8: give "
      "--microbatch 1")],
)  # fmt: skip
def test_the_cli_probes_inputs_are_refused_by_their_own_name(flags, says, capsys):
    """Issue 60's third and fourth CLI probes: --gpus 2^53 was refused as "--batch" (never
    given), --price-per-hour 1e300 printed "$inf", "--hardware h100" listed every device
    without the three it may mean, and a micro-batch that does not divide named --dp and
    --fsdp, which --gpus had filled."""
    assert main(["estimate", "--model", "llama3-8b", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
