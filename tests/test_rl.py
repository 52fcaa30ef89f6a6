"""The RL step (issue 40): its phases add up, placements order as they should, longer
responses shift the step toward generation, and bad input is one line naming the field."""

from __future__ import annotations

import json

import pytest

from costmodel.cli import main
from costmodel.rl import RLSpec, rl_step

ARGV = ["rl", "--model", "qwen3-8b", "--gpus", "8", "--prompts", "64", "--input", "256",
        "--output", "512"]  # fmt: skip
BASE = {"prompts": 128, "samples": 8, "input": 512, "output": 1024, "gpus": 8, "rollout_tp": 2}


def test_the_phases_add_up_to_the_step_and_the_share_is_generations():
    out = rl_step("qwen3-8b", RLSpec(**BASE), "h100-sxm")
    parts = ("rl.generation_s", "rl.scoring_s", "rl.train_s", "rl.weight_sync_s")
    assert sum(out[k] for k in parts) == pytest.approx(out["rl.step_s"])
    assert out["rl.generation_share"] == pytest.approx(out["rl.generation_s"] / out["rl.step_s"])
    assert out["rl.rollout_replicas"] == 4 and out["rl.train_fits"]
    # every response the mean: each engine runs its 256 at once for 1,024 iterations
    assert out["rl.rollout_peak_batch"] == 128 * 8 / 4
    assert out["rl.rollout_iterations"] == 1024 and out["rl.rollout_preemptions"] == 0


def test_longer_responses_shift_the_step_toward_generation():
    short = rl_step("qwen3-8b", RLSpec(**BASE), "h100-sxm")
    long = rl_step("qwen3-8b", RLSpec(**{**BASE, "output": 8192}), "h100-sxm")
    assert long["rl.generation_share"] > short["rl.generation_share"]


def test_async_overlaps_generation_with_training():
    spec = {**BASE, "gpus": 16}
    sync = rl_step("qwen3-8b", RLSpec(**spec, placement="separate"), "h100-sxm")
    both = rl_step("qwen3-8b", RLSpec(**spec, placement="async"), "h100-sxm")
    longer = max(both["rl.generation_s"], both["rl.scoring_s"] + both["rl.train_s"])
    assert both["rl.step_s"] == pytest.approx(longer + both["rl.weight_sync_s"])
    assert both["rl.step_s"] < sync["rl.step_s"]


def test_the_cli_prints_the_step_and_its_json(capsys):
    assert main(ARGV) == 0
    out = capsys.readouterr().out
    assert "verdict: fits; limited by" in out and "assumptions: 8 samples per prompt" in out
    assert "every response the mean (a lower bound" in out
    assert main([*ARGV, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"]["fits"] and 0 < out["rl"]["generation_share"] < 1


def test_one_gpu_is_counted_in_the_singular(capsys):
    """Issue 60's cosmetics, in rl: one GPU printed "1 engines", "fsdp2 over 1 GPUs" and
    "tokens/s over the 1 GPUs"; a count of one is singular, of several plural."""
    one = ["rl", "--model", "cs336-small", "--gpus", "1", "--prompts", "4", "--input", "64",
           "--output", "64"]  # fmt: skip
    assert main(one) == 0
    out = capsys.readouterr().out
    assert "1 engine of tp 1" in out and "fsdp2 over 1 GPU," in out and "over the 1 GPU (" in out
    assert "1 GPUs" not in out and "1 engines" not in out and "0 preemptions" in out


def test_a_step_whose_training_does_not_fit_says_so_first_and_gives_no_step_time(capsys):
    """Issue 60's probe: one GPU's training peak (152.6 GiB) was inside the training row while
    the headline said 'limited by: generation' and a 14 h step followed."""
    argv = ["rl", "--model", "qwen3-8b", "--gpus", "1", "--prompts", "64", "--input", "512",
            "--output", "2048"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  verdict: does NOT fit: training peaks at")
    assert lines[-1] == "  step: none: training does not fit"
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == {"fits": False}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rollout-tp", "3"], "--rollout-tp must divide rollout GPUs"),
        (["--placement", "separate", "--rollout-gpus", "8"], "--rollout-gpus must be in [1, 7]"),
        (["--rollout-gpus", "4"], "--rollout-gpus (4) applies to separate pools"),  # was ignored
        (["--rollout-engine", "tgi"], "invalid choice: 'tgi'"),
        (["--prompts", "0"], "prompts must be >= 1"),
        (["--gpus", "1000"], "gpus: the 1000 data-parallel training ranks must divide the 512"),
        (["--gpus", "24", "--rollout-tp", "8"], "gpus: the 24 data-parallel training ranks"),
        (["--response-sigma", "-1"], "--response-sigma"),
        (["--max-output", "256"], "output (the mean response, 512) must be at most --max-output"),
        (["--minibatches", "3"], "minibatches (3) must divide the 512 sequences"),
        (["--train-tp", "3"], "--train-tp x --train-pp (3) must divide the 8 training GPUs"),
        (["--rollout-memory", "1.5"], "--rollout-memory must be <= 1"),
        (
            ["--response-sigma", "2", "--max-output", "30000", "--rollout-memory", "0.25"],
            "do not fit the engine's cache",
        ),
        (["--max-output", "900000"], "--max-output: context (input + output = 900,256) exceeds"),
        (["--output", "90000"], "RoPE scaling by"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(extra, message, capsys):
    assert main([*ARGV, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_pack_holds_at_most_a_ranks_share_of_the_step():
    """A probe: --pack-tokens 100,000,000 priced micro-batches of 65,104 sequences (a peak of
    647,297 GiB) where each of 8 ranks has 64 of the step's 512."""
    from costmodel.rl.step import training_estimate as _training

    spec = RLSpec(gpus=8, prompts=64, samples=8, input=512, output=1024,
                  pack_tokens=100_000_000)  # fmt: skip
    est = _training("llama3-8b", spec, "h100-sxm", 1024)
    assert est.train.batch == 512 and est.train.batch // est.train.grad_accum == 512


def test_rl_gives_the_caveats_estimate_and_serve_give_for_its_model_and_device(capsys):
    """A mixture-of-experts model on a datasheet-only device: training's device and MoE
    caveats (as ``estimate`` gives them) and serving's MoE caveat for the rollouts, in the
    text and in the JSON; a dense model on a calibrated device has none of them."""
    argv = ["rl", "--model", "mixtral-8x7b", "--hardware", "h200", "--gpus", "16",
            "--prompts", "64", "--samples", "8", "--input", "512", "--output", "1024",
            "--train-ep", "8", "--rollout-tp", "2"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "caveat: h200 is datasheet only" in text
    assert "caveat: mixture-of-experts steps" in text
    assert "caveat: mixture-of-experts serving" in text
    assert main([*argv, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["caveats"]
    assert [c.split(" ")[0] for c in said] == ["h200", "mixture-of-experts", "mixture-of-experts"]
    assert main(ARGV) == 0
    assert "caveat:" not in capsys.readouterr().out


def test_the_trainers_recompute_is_a_flag_said_in_the_assumptions(capsys):
    """Issue 60's third probe: rl trained with no recomputation, unsaid and with no flag,
    so Qwen3-30B-A3B on 8 H100s "did not fit" where full recomputation fits (as estimate's
    nearest fit says)."""
    from costmodel.cli import main

    argv = ["rl", "--model", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--gpus", "8",
            "--prompts", "64", "--input", "512", "--output", "4096",
            "--rollout-tp", "2"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "--train-recompute full" in out
    assert "recompute none (the default; --train-recompute)" in out
    assert main([*argv, "--train-recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "verdict: fits" in out and "recompute full," in out


def test_async_names_what_sets_its_step_and_pools_say_their_split(capsys):
    """Issue 60's fifth probe: under ``--placement async`` the verdict said "limited by
    generation (67% of the step)" where generation (38 s) ran beside scoring and training
    (56 s), which set the step; the separate pools' 4/4 split was a default unsaid."""
    from costmodel.cli import main

    base = ["rl", "--model", "qwen3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--prompts",
            "64", "--samples", "8", "--input", "512", "--output", "2048"]  # fmt: skip
    assert main([*base, "--placement", "async"]) == 0
    out = capsys.readouterr().out
    assert "limited by scoring and training (" in out and "runs beside them one step" in out
    assert "4 of the 8 GPUs generate, 4 train (default: half; --rollout-gpus)" in out
    assert main([*base, "--placement", "separate", "--rollout-gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 of the 8 GPUs generate, 4 train;" in out


def test_the_rope_scaling_the_error_names_is_a_flag_rl_takes(capsys):
    """A probe: a response past the positions said "--rope-scaling would allow it", a flag
    only serve had; rl takes it now (for its rollout engine), and separate pools on one GPU
    say so instead of "rollout_gpus must be in [1, 0]"."""
    argv = ["rl", "--model", "qwen3-8b", "--gpus", "8", "--prompts", "8", "--input", "512",
            "--output", "50000", "--train-recompute", "full", "--json"]  # fmt: skip
    assert main(argv) == 2
    assert "RoPE scaling by 1.23x" in capsys.readouterr().err
    assert main([*argv, "--rope-scaling", "1.25"]) == 0
    assert json.loads(capsys.readouterr().out)
    with pytest.raises(ValueError, match="separate pools need at least 2 GPUs"):
        RLSpec(prompts=8, input=512, output=512, gpus=1, placement="separate")
    with pytest.raises(ValueError, match="rope_scaling must be >= 1"):
        RLSpec(prompts=8, input=512, output=512, gpus=8, rope_scaling=0.5)
