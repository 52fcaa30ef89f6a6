"""The CLI's answers to the questions issue 60's seventh probe asked: flags that change
nothing said so, defaults announced, the cost objective's ties."""

from __future__ import annotations

from costmodel.cli import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_a_bucket_size_where_no_all_reduce_is_bucketed_is_said_to_change_nothing(capsys):
    """The probe: --bucket-mb under FSDP over every device (no replicas) printed the same
    step as without it, and no note."""
    base = ("estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
            "--seq", "4096", "--batch", "32", "--framework", "fsdp2")  # fmt: skip
    _, plain = _run(capsys, *base)
    _, bucketed = _run(capsys, *base, "--bucket-mb", "1")
    assert "--bucket-mb 1 sizes the buckets of a data-parallel all-reduce" in bucketed
    step = [line for line in plain.splitlines() if line.startswith("step")]
    assert step == [line for line in bucketed.splitlines() if line.startswith("step")]
    _, ddp = _run(capsys, "estimate", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus",
                  "8", "--bucket-mb", "1")  # fmt: skip
    assert "--bucket-mb" not in ddp  # DDP's replicas reduce in those buckets


def test_a_routed_models_expert_gemms_are_announced(capsys):
    """The probe: Megatron's looped expert GEMMs (at efficiency.grouped of a dense GEMM)
    made Mixtral's step 4.200 s against 2.612 s grouped, and the assumptions did not say."""
    base = ("estimate", "--model", "mixtral-8x7b", "--seq", "4096", "--framework", "megatron",
            "--dp", "4", "--pp", "2", "--cp", "2", "--ep", "8", "--hardware", "h100-sxm",
            "--gpus", "16", "--batch", "64", "--microbatch", "1")  # fmt: skip
    _, out = _run(capsys, *base)
    assert ("expert GEMMs: one GEMM per local expert launched from the host (Transformer "
            "Engine's GroupedLinear), at efficiency.grouped of a dense GEMM (megatron's "
            "default; --expert-gemm grouped)") in out  # fmt: skip
    _, grouped = _run(capsys, *base, "--expert-gemm", "grouped")
    assert "expert GEMMs: one grouped kernel for all local experts (--expert-gemm loop)" in grouped
    _, dense = _run(capsys, "estimate", "--model", "llama3-8b", "--hardware", "h100-sxm",
                    "--gpus", "8")  # fmt: skip
    assert "expert GEMMs" not in dense


def test_bounds_names_the_flags_the_book_does_not_read(capsys):
    """The probe: bounds printed the same B* with --pp, --recompute or --seq as without,
    as if it were that layout's."""
    base = ("bounds", "--model", "llama3-8b", "--fsdp", "8", "--hardware", "h100-sxm")
    _, plain = _run(capsys, *base)
    assert "note:" not in plain
    _, more = _run(capsys, *base, "--pp", "2", "--gpus", "16", "--recompute", "full")
    assert ("note: the book's bounds read the model's shape, fsdp, tp, the device and the "
            "precision alone: --recompute full, --pp 2 change nothing here") in more  # fmt: skip
    answer = [line for line in plain.splitlines() if line.startswith("answer")]
    assert answer == [line for line in more.splitlines() if line.startswith("answer")]


def test_plans_sizing_flags_without_a_token_budget_are_one_line(capsys):
    """The probe: --price-per-hour, --checkpoint-gbps, --pue, --kwh-price, --failures-per-
    gpu-hour and --restart-minutes changed nothing without --token-budget, unsaid."""
    base = ("plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq", "4096",
            "--gpus", "8", "--global-batch", "64", "--top", "2")  # fmt: skip
    sizing = (("--checkpoint-gbps", "10"), ("--pue", "1.5"), ("--kwh-price", "0.1"),
              ("--failures-per-gpu-hour", "0.5"), ("--restart-minutes", "30"))  # fmt: skip
    for flag, value in sizing:
        assert main([*base, flag, value]) == 2
        assert f"{flag} sizes a run on --token-budget" in capsys.readouterr().err
    assert main([*base, "--price-per-hour", "3"]) == 2
    assert "--price-per-hour prices a --token-budget" in capsys.readouterr().err
    assert main([*base, "--price-per-hour", "3", "--token-budget", "1e9"]) == 0


def test_the_nearest_fit_recomputes_no_more_than_it_must(capsys):
    """The probe: Llama-3-8B on 8 H100 at 32 x 8,192 was told recompute full + ZeRO-3 (4.46
    s) where selective-op with the same sharding fits and runs 3.85 s."""
    import json

    argv = ["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
            "--seq", "8192", "--batch", "32", "--json"]  # fmt: skip
    _, out = _run(capsys, *argv)
    near = json.loads(out)["verdict"]["nearest_fit"]
    assert near["inputs"]["recompute"] == "selective-op" and near["inputs"]["fsdp"] == 8
    _, full = _run(capsys, *argv[:-1], "--fsdp", "8", "--zero", "3", "--recompute", "full",
                   "--json")  # fmt: skip
    assert near["step_s"] < json.loads(full)["time_s"]["step"]


def test_a_drive_rate_without_the_drive_is_one_line(capsys):
    """The probe: offload --nvme-gbps 0.1 without --optimizer-state nvme changed nothing,
    unsaid; with it the optimizer step takes 965 s."""
    base = ("offload", "--model", "llama3-8b", "--seq", "8192", "--batch", "68", "--precision",
            "bf16", "--host-budget-gb", "70", "--device-budget-gb", "30")  # fmt: skip
    assert main([*base, "--nvme-gbps", "0.1"]) == 2
    assert "--nvme-gbps rates the drive --optimizer-state nvme" in capsys.readouterr().err
    assert main([*base, "--nvme-gbps", "0.1", "--optimizer-state", "nvme"]) == 0


def test_a_replicated_cache_is_labelled_whole_and_a_rate_is_bounded(capsys):
    """The probe: MLA's latent cache, whole on every tp rank, read "(of tp 8)" like a share;
    --request-rate 1e308 printed a 309-digit rate."""
    _, mla = _run(capsys, "serve", "--model", "deepseek-v3", "--tp", "8", "--hardware", "h200",
                  "--precision", "fp8", "--input", "1000", "--output", "100")  # fmt: skip
    assert "70,272 B a device (whole on each of the tp 8 ranks)" in mla
    _, gqa = _run(capsys, "serve", "--model", "llama3-70b", "--tp", "4", "--input", "1000",
                  "--output", "100")  # fmt: skip
    assert "81,920 B a device (its share of tp 4)" in gqa
    assert main(["serve", "--model", "llama3-8b", "--input", "1000", "--output", "200",
                 "--request-rate", "1e308"]) == 2  # fmt: skip
    assert "--request-rate must be <= 1,000,000 requests/s" in capsys.readouterr().err


def test_a_reserve_over_the_budget_is_said_in_the_apps_words(capsys):
    """The probe: the app's banner read "Fits, with little margin" where the CLI's verdict
    began "fits" for the same estimate (the app's defaults)."""
    _, out = _run(capsys, "estimate", "--model", "cs336-2.7b", "--hardware", "h100-sxm",
                  "--gpus", "1")  # fmt: skip
    assert out.startswith("verdict      fits, with little margin: peak 63.5 GiB")


def test_the_eighth_probes_inputs_are_named_or_refused(capsys):
    """Round eight: a TPU plan of Megatron alone said "no layout splits batch 64" (Megatron
    runs on CUDA GPUs only); numpy floats read "must be a number"; --attention-kernel under
    naive attention and --price-per-hour without a device changed nothing, unsaid."""
    import numpy as np

    import costmodel as cm

    assert main(["plan", "--model", "llama3-8b", "--hardware", "tpu-v5p", "--gpus", "8",
                 "--global-batch", "64", "--frameworks", "megatron"]) == 2  # fmt: skip
    assert "megatron runs on CUDA GPUs, not on tpu-v5p" in capsys.readouterr().err
    est = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, fsdp=8,
                      memory_headroom=np.float32(0.9), price_per_hour=np.float32(2.5),
                      token_budget=np.int64(10**12))  # fmt: skip
    assert est.fit().fits
    _, out = _run(capsys, "estimate", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus",
                  "1", "--attention", "naive", "--attention-kernel", "fa3")  # fmt: skip
    assert "--attention-kernel fa3 names a fused kernel: attention naive runs none" in out
    assert main(["estimate", "--model", "gpt2", "--price-per-hour", "2"]) == 2
    assert "--hardware is required with --price-per-hour" in capsys.readouterr().err


def test_a_context_past_any_rope_scaling_does_not_suggest_one(capsys):
    """Round eight: a context 4,100x the positions suggested RoPE scaling 4.1e3x, which the
    input then refuses (at most 1,024x)."""
    assert main(["serve", "--model", "llama3-8b", "--input", "40000000", "--output", "10"]) == 2
    err = capsys.readouterr().err
    assert "no RoPE scaling taken reaches it (4,883x; at most 1,024x)" in err


def test_a_dense_plan_refuses_a_dispatcher_as_estimate_does(capsys):
    """Round eight: plan --ep-dispatchers deepep on a dense model was taken without a word,
    where estimate --ep-dispatcher deepep is refused."""
    argv = ["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
            "--global-batch", "64", "--ep-dispatchers", "all-to-all,deepep"]  # fmt: skip
    assert main(argv) == 2
    assert "llama3-8b has no routed experts" in capsys.readouterr().err
