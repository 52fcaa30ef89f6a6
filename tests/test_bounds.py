"""Issue 60's reproducers: each answers, or is refused in one line naming its field, in
bounded work; ``serve`` withholds times for a batch that does not fit and names the nearest
fit, and carries a mixture-of-experts model's caveat, in the CLI as in the app."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from costmodel.answers.serve import SERVING_RECORD, moe_serving_figures
from costmodel.catalog.fitted import fitted
from costmodel.cli import main
from costmodel.engine.padding import pack_rows, packed_row_count
from costmodel.engine.quantities import flat


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("as_json", [False, True])
def test_serving_an_moe_model_on_a_cpu_answers(capsys, as_json):
    """Its host dispatch counts an MoE block's kernels in the block's sizes: they are
    substituted (was: "cannot determine truth value of Relational")."""
    argv = ["serve", "--model", "mixtral-8x7b", "--context", "4096", "--hardware", "cpu"]
    code, out, err = _run(capsys, *argv, *(["--json"] if as_json else []))
    assert code == 0 and not err
    if as_json:
        data = flat(json.loads(out))
        # memory only for a batch that does not fit, as the text says (no TTFT)
        assert data["verdict.fits"] is False and "time_s.ttft" not in data
        assert data["memory_bytes_per_device.total"] > 0
    else:
        assert "TTFT, TPOT, tokens/s   none: the batch does not fit" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--model", "llama3-8b", "--rope-scaling", "1e308", "--context", "4096"],
         "--rope-scaling must be <= 1024"),
        (["rl", "--model", "qwen3-8b", "--gpus", "8", "--prompts", "1000000000000", "--input",
          "512", "--output", "2048"], "--prompts x --samples must be <= 65,536"),
        (["rl", "--model", "qwen3-8b", "--gpus", "8", "--prompts", "64", "--input", "512",
          "--output", "2048", "--samples", "1000000"], "--prompts x --samples must be <= 65,536"),
        (["padding", "--model", "llama3-8b", "--seq", "4096", "--distribution",
          "lognormal:median=700,sigma=1", "--samples", "1000000000000"],
         "samples must be <= 16,777,216"),
        (["plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--max-gpus",
          "9007199254740992", "--seq", "4096", "--global-batch", "64"],
         "--max-gpus must be <= 262,144"),
    ],
)  # fmt: skip
def test_unbounded_inputs_are_refused_in_one_line(capsys, argv, says):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and not out and err.count("\n") == 1 and says in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("kind", ["fifo", "folder", "binary"])
def test_a_lengths_file_that_is_no_text_file_says_what_it_is(tmp_path, capsys, kind):
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"12\n\xff\xfe\n")
    argv = ["padding", "--model", "llama3-8b", "--seq", "4096", "--lengths", str(path)]
    code, _, err = _run(capsys, *argv)
    want = "is not UTF-8 text" if kind == "binary" else "is not a regular file"
    assert code == 2 and want in err and "does not exist" not in err


def test_a_plain_lengths_file_reads_as_its_numbers(tmp_path):
    from costmodel.catalog.lengths import read_lengths

    lengths = np.random.default_rng(0).integers(1, 9000, 10_000)
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(map(str, lengths)) + "\n")
    assert np.array_equal(read_lengths(path), lengths)
    path.write_text("# a histogram\n100 3\n200,2\n\n")
    assert read_lengths(path).tolist() == [100, 100, 100, 200, 200]


def test_packing_counts_the_rows_best_fit_makes():
    """The bulk count equals the document-by-document best fit (which took minutes for
    millions of documents) on varied lengths, row sizes and ties."""
    rng = np.random.default_rng(1)
    for case in range(400):
        row = int(rng.integers(1, 80))
        n = int(rng.integers(1, 400))
        lengths = (
            rng.integers(1, row + 1, n) if case % 2 else np.minimum(rng.geometric(0.1, n), row)
        )
        assert packed_row_count(lengths, row) == len(pack_rows(lengths, row)), (row, case)


def test_serve_withholds_times_and_names_the_nearest_fit(capsys):
    code, out, _ = _run(capsys, "serve", "--model", "llama3-70b", "--context", "4096",
                        "--batch", "512")  # fmt: skip
    assert code == 0
    verdict = next(line for line in out.splitlines() if "verdict" in line)
    assert "does NOT fit" in verdict and "nearest fit: --" in verdict
    assert "TTFT (prefill)" not in out and "limited by" not in out
    _, nearest = verdict.split("nearest fit: ")
    flags = nearest.split(" fits the batch")[0].split()
    code, out, _ = _run(capsys, "serve", "--model", "llama3-70b", "--context", "4096",
                        "--batch", "512", *flags)  # fmt: skip
    assert code == 0 and "verdict                fits" in out and "TTFT (prefill)" in out


def test_serving_an_moe_model_carries_its_recorded_caveat(capsys):
    figs = moe_serving_figures()
    record = fitted()[SERVING_RECORD].figures
    assert (
        figs["runs"] == record["moe"]["runs"] > 0
        and figs["median"] == record["moe"]["loso"]["median"]
    )
    _, out, _ = _run(capsys, "serve", "--model", "mixtral-8x7b", "--context", "4096",
                     "--tp", "2", "--batch", "8")  # fmt: skip
    (line,) = [x for x in out.splitlines() if x.strip().startswith("caveat")]
    assert f"{figs['runs']} published MoE serving runs" in line
    assert f"off by {figs['median']:.0%} at the median" in line
    _, dense, _ = _run(capsys, "serve", "--model", "llama3-8b", "--context", "4096")
    assert "caveat" not in dense


def test_the_serving_page_quotes_the_recorded_moe_serving_figures():
    from pathlib import Path

    readme = " ".join((Path(__file__).parents[1] / "docs/serving.md").read_text().split())
    figs = moe_serving_figures()
    assert f"({figs['runs']} Mixtral-8x7B runs of one source: {figs['median']:.0%} median" in readme


def test_min_fsdp_that_nothing_fits_says_why_and_what_it_held(capsys):
    code, out, _ = _run(capsys, "solve", "min-fsdp", "--model", "xxl", "--hardware", "tpu-v5p",
                        "--framework", "fsdp2", "--budget-gb", "95", "--seq", "8192",
                        "--batch-tokens", "0", "--json")  # fmt: skip
    answer = json.loads(out)["answer"]
    assert code == 0 and answer["fsdp"] is None
    assert answer["why"].startswith("no fsdp degree up to 65,536 fits")
    assert answer["assumed"].startswith("8,192 tokens per device (1 x seq 8192; --batch-tokens 0")


def test_max_batch_does_not_state_the_micro_batch_it_grows(capsys):
    code, out, _ = _run(capsys, "solve", "max-batch", "--model", "llama3-8b", "--hardware",
                        "h100-sxm", "--gpus", "8", "--framework", "fsdp2", "--seq", "4096",
                        "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["batch"] == 16
    assert (
        "micro-batch per device grows" in data["assumed"] and "micro-batch 1" not in data["assumed"]
    )


def test_max_seq_past_the_models_positions_says_so(capsys):
    code, out, _ = _run(capsys, "solve", "max-seq", "--model", "llama3-8b", "--hardware",
                        "h100-sxm", "--gpus", "8", "--framework", "fsdp2", "--batch", "8",
                        "--json")  # fmt: skip
    data = json.loads(out)
    assert (
        code == 0
        and data["seq"] > 8192
        and "past llama3-8b's 8,192 trained positions" in data["note"]
    )


def test_bounds_prints_rates_with_units(capsys):
    _, out, _ = _run(capsys, "bounds", "--model", "xxl", "--hardware", "tpu-v5p", "--fsdp", "16",
                     "--tp", "4")  # fmt: skip
    assert (
        "device      459 TFLOP/s; fsdp over ICI (per mesh axis, both directions) at 180 GB/s" in out
    )
    assert "459000000000000" not in out


def test_a_verdict_prints_the_digits_that_tell_peak_from_budget():
    from costmodel.engine.fit import Fit

    fit = Fit(fits=False, peak_bytes=21.63 * 2**30, reserved_bytes=22 * 2**30,
              capacity_bytes=24 * 2**30, budget_bytes=21.6 * 2**30, headroom=0.9)  # fmt: skip
    assert fit.sentence().startswith("does not fit: peak 21.63 GiB > 21.60 GiB")


@pytest.mark.parametrize("framework", ["fsdp2", "reference", "deepspeed", "megatron"])
def test_full_recompute_never_peaks_above_none(framework):
    """Issue 60: gemma-2-2b on 8 H100, fsdp2 peaked higher under full recompute (a
    recomputed block's casts counted where FSDP2 gathers bf16 weights, and where none keeps
    the same casts); measured on the meta device, the two peaks are equal."""
    from costmodel import ParallelSpec, TrainSpec, estimate, get_hardware, get_model

    peaks = {}
    for recompute in ("none", "selective", "full"):
        degrees = {"fsdp": 8} if framework in ("fsdp2", "deepspeed") else {"dp": 8}
        train = TrainSpec(batch=8, seq=128, recompute=recompute)
        par = ParallelSpec(framework=framework, **degrees)
        est = estimate(get_model("gemma-2-2b"), train, par, get_hardware("h100-sxm"))
        peaks[recompute] = est["memory_bytes_per_device.peak"]
    assert peaks["full"] <= peaks["selective"] <= peaks["none"], peaks


def _lines_between(out: str, heading: str, end: str) -> list[tuple[str, str]]:
    """(label, value) of the printed lines under ``heading``, up to ``end``."""
    lines = out.split(heading, 1)[1].split(end, 1)[0].splitlines()
    pairs = [line.strip().partition("  ")[::2] for line in lines]
    return [(label.strip(), value.strip()) for label, value in pairs if value]


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "llama3-70b", "--gpus", "16", "--tp", "8", "--pp", "2", "--framework",
         "megatron", "--seq", "4096", "--batch", "32"],
        ["--model", "llama3-8b", "--hardware", "rtx-4090", "--finetune", "qlora", "--recompute",
         "full"],
        ["--model", "llama3-8b", "--gpus", "8", "--framework", "fsdp2"],
        ["--model", "llama3-8b", "--gpus", "8", "--framework", "deepspeed", "--zero", "1"],
    ],
)  # fmt: skip
def test_the_memory_lines_add_up_to_the_peak(capsys, argv):
    """Every line under "memory per device" but reserved sums to the printed peak (frozen
    weights, buffers and the transients named), to the rounding of the printed digits."""
    hardware = [] if "--hardware" in argv else ["--hardware", "h100-sxm"]
    code, out, _ = _run(capsys, "estimate", *argv, *hardware)
    assert code == 0
    parts = {}
    for label, value in _lines_between(out, "memory per device", "time per step"):
        if label == "peak falls at":  # a phase, not bytes
            continue
        amount = float(value.split("minus ")[-1].split(" GiB")[0].split(" MiB")[0].replace(",", ""))
        scale = 2**30 if " GiB" in value else 2**20
        parts[label] = amount * scale * (-1 if "minus" in value else 1)
    peak = parts.pop("peak")
    parts.pop("reserved")
    assert "frozen weights" in parts or "qlora" not in argv
    assert sum(parts.values()) == pytest.approx(peak, abs=0.006 * 2**30 * len(parts))


def test_a_zero_stage_asked_for_shards_or_is_refused(capsys):
    base = ["estimate", "--model", "llama3-8b", "--gpus", "8", "--hardware", "h100-sxm"]
    code, out, _ = _run(capsys, *base, "--zero", "2")
    assert code == 0 and "ZeRO-2 over fsdp 8" in out  # was: DDP, nothing sharded, no note
    code, _, err = _run(capsys, *base, "--dp", "8", "--zero", "2")
    assert code == 2 and "zero 2 shards over the fsdp ranks and fsdp is 1" in err
    _, out, _ = _run(capsys, *base, "--framework", "deepspeed")
    assert "ZeRO-3 (costmodel's default for a ZeRO framework; DeepSpeed's own is stage 0" in out
    _, out, _ = _run(capsys, *base, "--fsdp", "8")  # the reference model's ZeRO: no DeepSpeed
    assert "ZeRO-3 (costmodel's default for a ZeRO framework; --zero 1, 2 or 3)" in out


def test_a_device_comparison_says_what_each_device_rests_on_and_its_memory_adds_up(capsys):
    code, out, _ = _run(capsys, "plan", "--model", "llama3-8b", "--hardware",
                        "h100-sxm,b200,mi300x", "--gpus", "8", "--seq", "4096",
                        "--global-batch", "64")  # fmt: skip
    assert code == 0
    for name in ("h100-sxm", "b200", "mi300x"):
        assert f"calibration of {name}: " in out
    assert "calibration of mi300x: datasheet only" in out
    line = next(x for x in out.splitlines() if "memory per device (GiB)" in x)
    terms, peak = line.split(": ", 1)[1].split(" = peak ")
    total = sum(float(t.split()[-1]) for t in terms.split(" + "))
    assert total == pytest.approx(float(peak.split(";")[0]), abs=0.06 * terms.count("+"))
    assert "; reserved " in line


def test_a_sweep_takes_estimates_default_batch_says_what_fits_and_names_arrays_that_clash():
    import costmodel as cm
    from costmodel.specs.checks import SpecError

    swept = cm.sweep(
        "llama3-8b",
        hardware="h100-sxm",
        fsdp=8,
        framework="fsdp2",
        reshard_after_forward=[True, False],
    )  # FSDP2's option (fmt: skip)
    one = cm.estimate("llama3-8b", hardware="h100-sxm", gpus=8, fsdp=8, framework="fsdp2")
    assert swept["batch"].tolist() == [one.train.batch] * 2 == [8, 8]  # was: refused at batch 4
    assert swept["fits"].tolist() == [True, True]
    assert swept["memory_bytes_per_device.peak"][0] == one["memory_bytes_per_device.peak"]
    with pytest.raises(
        SpecError, match=r"fsdp \(shape \(2,\)\) and tp \(shape \(3,\)\) do not broadcast"
    ):
        cm.sweep("llama3-8b", hardware="h100-sxm", fsdp=[8, 4], tp=[1, 2, 4])


def test_an_estimate_evaluates_a_formula_by_replacing_every_symbol_at_once():
    import costmodel as cm
    from costmodel.specs.checks import SpecError

    est = cm.estimate("cs336-small", hardware="h100-sxm", gpus=2, batch=8, seq=256)
    step = est.expr("time_s.step")
    assert est.evaluate(step) == pytest.approx(est["time_s.step"], rel=1e-12)
    assert est.evaluate("memory_bytes_per_device.peak") == est["memory_bytes_per_device.peak"]
    with pytest.raises(SpecError, match="a quantity's name or a sympy expression"):
        est.evaluate(1.5)  # nothing a caller passes is parsed
    with pytest.raises(SpecError, match="no value for: z"):
        est.evaluate(step + cm.symbol("T") * 0 + __import__("sympy").Symbol("z"))


def test_a_serving_estimate_reads_as_a_dict_and_prints_short():
    from costmodel import get_hardware, get_model
    from costmodel.serving import serve
    from costmodel.specs.serving import ServeSpec

    est = serve(
        get_model("llama3-8b"), ServeSpec(input=1000, output=100, batch=8), get_hardware("h100-sxm")
    )
    assert "fits" in est and dict(est) == est.values and len(est) == len(est.values)
    text = repr(est)
    assert text.startswith("ServeEstimate(fits (up to ") and "TPOT" in text and len(text) < 200
    # issue 60: a load that does not fit printed "0 sequences fit" beside its TTFT and
    # tokens/s; now the CLI's words and no times
    over = serve(get_model("llama3-70b"), ServeSpec(input=4000, output=500, batch=64),
                 get_hardware("h100-sxm"))  # fmt: skip
    text = repr(over)
    assert text.startswith("ServeEstimate(does NOT fit: the weights alone do not fit")  # 141 GB
    assert "TTFT" not in text and "tokens/s" not in text


def test_help_on_the_serving_and_rl_specs_shows_each_fields_words():
    import pydoc

    from costmodel.rl.spec import RLSpec
    from costmodel.specs.serving import ServeSpec

    serve_text = pydoc.render_doc(ServeSpec, renderer=pydoc.plaintext)
    assert (
        "Prompt tokens per request." in serve_text and "kv_dtype: str | None = None" in serve_text
    )
    assert "Mean response tokens." in pydoc.render_doc(RLSpec, renderer=pydoc.plaintext)


@pytest.mark.parametrize(("layout", "says"), [
    (["--fsdp", "8", "--tp", "8"], "critical batch B* = 348,154 tokens a step (5,440 per device)"
                                   ": compute-bound above B*"),
    (["--tp", "8"], "no critical batch: compute-bound at any batch (tp below"),
    (["--tp", "16"], "critical batch B* = none: never compute-bound"),
    ([], "no critical batch: no communication: compute-bound at any batch"),
])  # fmt: skip
def test_bounds_says_the_regime_in_words_for_every_layout(capsys, layout, says):
    """Issue 60's probe: fsdp x tp layouts failed with "Cannot convert complex to float"
    (B* solved symbolically went negative, its square root complex), tp 8 (below the
    book's tp_max_degree 9.78) printed the same "B* = \\infty" as tp 16, and one device an
    unexplained 0. B* is now solved at the layout's numbers, each group on its own link
    (tp on NVLink, the fsdp group across nodes on the network), and said in words."""
    argv = ["bounds", "--model", "llama3-8b", "--hardware", "h100-sxm", *layout]
    code, out, err = _run(capsys, *argv)
    assert code == 0 and not err
    answer = next(line for line in out.splitlines() if not line.startswith("warning: "))
    assert answer.startswith(f"answer      {says}")
    assert f"tp up to degree {8.7 if '16' in layout else 9.8}" in out  # tp 16 over the NICs
    assert "\\" not in out  # no LaTeX in the text


def test_mesh_axes_are_refused_off_tpu_and_each_link_has_its_vendors_name(capsys):
    """A probe: ``--mx 3`` on an H100 tripled its link (B* 17,589 -> 5,863 tokens) without a
    word, and MI300X's Infinity Fabric was called NVLink."""
    code, _, err = _run(capsys, "bounds", "--model", "llama3-8b", "--hardware", "h100-sxm",
                        "--fsdp", "8", "--mx", "3")  # fmt: skip
    assert code == 2 and "--mx > 1 gives a group more of a TPU's ICI mesh axes" in err
    code, out, _ = _run(capsys, "bounds", "--model", "llama3-8b", "--hardware", "mi300x",
                        "--fsdp", "8", "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["link"] == "Infinity Fabric (inside one node of 8)"
    code, _, err = _run(capsys, "estimate", "--model", "llama3-8b", "--hardware", "h100-sxm",
                        "--gpus", "8", "--my", "2")  # fmt: skip
    assert code == 2 and "--my > 1" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "llama3-70b", "--gpus", "64", "--fsdp", "64", "--framework", "fsdp2",
         "--seq", "8192", "--batch", "512", "--recompute", "full"],
        ["--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--framework",
         "megatron", "--seq", "8192", "--batch", "256", "--recompute", "full"],
        ["--model", "mixtral-8x7b", "--gpus", "64", "--ep", "8", "--framework", "megatron",
         "--seq", "4096", "--batch", "256", "--recompute", "full"],
    ],
)  # fmt: skip
def test_the_time_lines_add_up_to_the_step(capsys, argv):
    """A probe: compute 63.6 s + communication 15.1 s + optimizer 29 ms printed beside a
    66.5 s step. The step is compute, the communication's exposed part, contention,
    bubble and optimizer (the communication line is all of it, mostly hidden)."""
    code, out, _ = _run(capsys, "estimate", *argv, "--hardware", "h100-sxm")
    assert code == 0
    parts = {}
    for label, value in _lines_between(out, "time per step", "tokens/s"):
        number, unit = value.split()[:2]
        parts[label] = float(number.replace(",", "")) * (1e-3 if unit == "ms" else 1)
    step, total = parts.pop("step"), parts.pop("communication")
    assert parts.pop("of it waiting for the host", 0) <= parts["compute"]  # a part of compute
    assert parts["of it exposed"] <= total
    assert sum(parts.values()) == pytest.approx(step, abs=2e-3 * len(parts))


def test_full_says_what_each_memory_section_is_of(capsys):
    """A probe: ``--full`` printed memory_bytes.params 1,002 MiB (the reference model's
    kept casts) above memory_bytes_per_device.params 1.96 GiB, both read as "params"."""
    code, out, _ = _run(capsys, "estimate", "--model", "llama3-8b", "--hardware", "h100-sxm",
                        "--gpus", "8", "--framework", "fsdp2", "--full")  # fmt: skip
    heads = [line for line in out.splitlines() if line.startswith("# memory")]
    assert code == 0 and len(heads) == 2
    assert "the whole model on one device as costmodel's reference model" in heads[0]
    assert "one device of this layout under its framework" in heads[1]
