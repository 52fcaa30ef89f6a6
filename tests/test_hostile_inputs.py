"""Hostile input over every command and file input (issue 38): each of several hundred seeded
cases is refused in one line that names the field, with exit status 2, or answered with
valid JSON (no NaN, no Infinity). Never a traceback, never another exit status.

Cases are every flag of every command with values chosen for its type (zero, negatives,
2^63, 10^400, nan, inf, text, a 5,000-character name, paths to a FIFO, /dev/zero or a
folder), files that are hostile in their content (hardware profiles, Hugging Face configs,
lengths files), and the app's URL parameters. A value that no reading makes valid must be
refused; a valid one may be answered or refused, but only as said above.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from costmodel.catalog.hardware import HARDWARE
from costmodel.cli import main, make_parser

INT_BAD = ("-1", "-9223372036854775809", "1" + "0" * 400, "nan", "1.5", "", "0x10", "1e3")
INT_ODD = ("0", str(2**62), str(2**53 + 1), "1000000")
FLOAT_BAD = ("nan", "inf", "-inf", "-1", "1e400", "")
FLOAT_ODD = ("0", "-0", "1e-400", "1e-300", "1e300")
TEXT_BAD = ("", "x" * 5000, "../../etc/passwd", "\x00", "None")
BASES = {
    "estimate": ["--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8", "--batch",
                 "32", "--seq", "2048", "--json"],
    "bounds": ["--model", "xxl", "--hardware", "tpu-v5p", "--fsdp", "16", "--tp", "4", "--mx",
               "2", "--my", "1", "--json"],
    "solve": ["min-fsdp", "--model", "llama3-8b", "--budget-gb", "80", "--seq", "8192",
              "--hardware", "h100-sxm", "--json"],
    "attention": ["--batch", "1", "--seq", "1024", "--head-dim", "64", "--heads", "8", "--json"],
    "padding": ["--model", "llama3-8b", "--seq", "4096", "--batch", "32", "--hardware",
                "h100-sxm", "--gpus", "8", "--fsdp", "8", "--distribution",
                "lognormal:median=721,sigma=0.85", "--json"],
    "plan": ["--model", "cs336-small", "--hardware", "h100-sxm", "--gpus", "2",
             "--global-batch", "8", "--seq", "512", "--frameworks", "fsdp2", "--recompute",
             "none", "--json"],
    "serve": ["--model", "llama3-8b", "--hardware", "h100-sxm", "--context", "4096", "--batch",
              "4", "--json"],
    "rl": ["--model", "cs336-small", "--hardware", "h100-sxm", "--gpus", "2", "--prompts", "4",
           "--input", "64", "--output", "64", "--json"],
}  # fmt: skip
"""A question each command answers (exit 0), which one flag at a time is made hostile."""


def _flags(command: str) -> list[tuple[str, str, str, bool]]:
    """(flag, dest, kind, takes a value) of a command's options, from the parser itself."""
    sub = next(a for a in make_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    out = []
    for a in sub.choices[command]._actions:
        if not a.option_strings or a.dest in ("help", "json"):
            continue
        kind = "choice" if a.choices else getattr(a.type, "__name__", "text")
        out.append((a.option_strings[-1], a.dest, kind, a.nargs != 0))
    return out


def _values(kind: str) -> list[tuple[str, bool]]:
    """(value, must be refused) for a flag of ``kind``."""
    if kind == "int_arg":
        return [(v, True) for v in INT_BAD] + [(v, False) for v in INT_ODD]
    if kind == "float":
        return [(v, True) for v in FLOAT_BAD] + [(v, False) for v in FLOAT_ODD]
    paths = ("/dev/zero", "/tmp", "/nonexistent/file.json")
    return [(v, True) for v in TEXT_BAD] + [(v, kind != "choice") for v in paths]


def _cases() -> list[tuple[list[str], str, bool]]:
    """Every command's flags with their hostile values, then a seeded sample of them."""
    cases = []
    for command, base in BASES.items():
        for flag, dest, kind, takes in _flags(command):
            if not takes or flag in ("--timeline",):
                continue
            for value, refuse in _values(kind):
                cases.append(([command, *base, flag, value], dest, refuse))
    rng = random.Random(38)
    return rng.sample(cases, 420)


def _run(argv: list[str]) -> tuple[Any, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exit_:
            rc = exit_.code
    return rc, out.getvalue(), err.getvalue()


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _assert_clean(argv: list[str], field: str, refuse: bool) -> None:
    rc, out, err = _run(argv)
    shown = " ".join(a if len(a) < 60 else a[:20] + "..." for a in [argv[0], *argv[-2:]])
    assert rc in (0, 1, 2), f"{shown}: exit {rc}\n{err[-2000:]}"
    if rc == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, f"{shown}: {err[:2000]}"
        words = {field, field.replace("_", "-"), field.replace("_", " ")}
        assert any(w in err for w in words), f"{shown}: the error does not name {field}: {err}"
    elif rc == 1:  # plan's answer that no layout fits: still an answer, in valid JSON
        assert argv[0] == "plan" and "no_fit" in _strict_json(out), f"{shown}: exit 1 {err}"
    else:
        assert not refuse, f"{shown}: accepted\n{out[:500]}"
        _strict_json(out)


@pytest.mark.parametrize(("argv", "field", "refuse"), _cases())
def test_every_flag_refuses_hostile_values_in_one_line(argv, field, refuse):
    _assert_clean(argv, field, refuse)


# Files: hardware profiles, Hugging Face configs, lengths files


def _profile(**changes: Any) -> str:
    return json.dumps({**HARDWARE["h100-sxm"], **changes})


HARDWARE_FILES = {
    "deep": ("[" * 100_000 + "]" * 100_000, "hardware"),
    "huge-number": (_profile(hbm_bw=10**400), "hbm_bw"),
    "tiny-bandwidth": (_profile(network_bw=1e-300), "network_bw"),
    "zero-link": (_profile(link_bw=0), "link_bw"),
    "nan": (_profile().replace('"hbm_bw": 3350000000000.0', '"hbm_bw": NaN'), "hbm_bw"),
    "negative": (_profile(hbm_bytes=-1), "hbm_bytes"),
    "absurd-memory": (_profile(hbm_bytes=1e308), "hbm_bytes"),
    "text-number": (_profile(hbm_bw="fast"), "hbm_bw"),
    "missing": (json.dumps({"kind": "gpu"}), "hardware"),
    "list": ("[1, 2]", "hardware"),
    "empty": ("", "hardware"),
    "not-utf8": (b"\xff\xfe{".decode("latin-1"), "hardware"),
    "overlap-2": (_profile(overlap=2), "overlap"),
    "overlap-negative": (_profile(overlap=-0.5), "overlap"),
    "efficiency-1.5": (_profile(efficiency={"matmul": 1.5}), "efficiency"),
    "no-devices": (_profile(devices_per_node=0), "devices_per_node"),
    "tile": (_profile(gemm_tile=[0, 1]), "gemm_tile"),
    "half-depth": (_profile(gemm_half_depth={"fp8": -1}), "gemm_half_depth.fp8"),
    "half-depth-dtype": (_profile(gemm_half_depth={"fp9": 245}), "gemm_half_depth"),
    "half-depth-list": (_profile(gemm_half_depth=[245]), "gemm_half_depth"),
    "sm-negative": (_profile(sm_count=-1), "sm_count"),
    "kernels": (_profile(attention_kernels={"fa9": {"forward": 1}}), "attention_kernels"),
    "kind": (_profile(kind="quantum"), "kind"),
    "calibration": (_profile(calibration={"max_mfu": 2}), "calibration"),
}
HF_FILES = {
    "deep": ("{" + '"a":{' * 50_000 + "}" * 50_001, "hf_config"),
    "empty-object": ("{}", "hf_config"),
    "negative-layers": (json.dumps({"model_type": "llama", "hidden_size": 64,
                                    "num_hidden_layers": -2, "num_attention_heads": 4,
                                    "vocab_size": 100, "intermediate_size": 128}),
                        "num_hidden_layers"),
    "huge": (json.dumps({"hidden_size": 10**400}), "hf_config"),
    "text": ("hello", "hf_config"),
    "list": ("[]", "hf_config"),
}  # fmt: skip
LENGTHS_FILES = {
    "huge-length": ("1" + "0" * 400 + "\n", "lengths"),
    "huge-count": ("512 1000000000000\n", "lengths"),
    "negative": ("-5\n", "lengths"),
    "words": ("hello world\n", "lengths"),
    "empty": ("", "lengths"),
    "zero": ("0\n", "lengths"),
    "float": ("1.5\n", "lengths"),
    "three-columns": ("1 2 3\n", "lengths"),
}


def _special(tmp_path: Path, name: str) -> str:
    if name == "fifo":
        path = tmp_path / "fifo.json"
        os.mkfifo(path)
        return str(path)
    return {"dev-zero": "/dev/zero", "folder": str(tmp_path)}[name]


FILE_FLAGS = {
    "hardware": (HARDWARE_FILES, "estimate", "--hardware", "hardware"),
    "hf": (HF_FILES, "estimate", "--hf-config", "hf_config"),
    "lengths": (LENGTHS_FILES, "padding", "--lengths", "lengths"),
}
FILE_CASES = [(kind, name) for kind, (files, *_) in FILE_FLAGS.items()
              for name in [*files, "fifo", "dev-zero", "folder"]]  # fmt: skip


@pytest.mark.parametrize(("kind", "name"), FILE_CASES)
def test_every_file_input_refuses_hostile_files_in_one_line(tmp_path, kind, name):
    files, command, flag, field = FILE_FLAGS[kind]
    if name in files:
        text, field = files[name]
        path = str(tmp_path / f"{name}.json")
        Path(path).write_text(text, encoding="latin-1" if name == "not-utf8" else "utf-8")
    else:
        path = _special(tmp_path, name)
    base = [a for a in BASES[command] if a != "--json"]
    if flag == "--hf-config":  # the config replaces the preset
        base = [a for i, a in enumerate(base) if a != "--model" and base[i - 1] != "--model"]
    if flag == "--hardware":
        i = base.index("--hardware")
        base = base[:i] + base[i + 2 :]
    if flag == "--lengths":
        i = base.index("--distribution")
        base = base[:i] + base[i + 2 :]
    _assert_clean([command, *base, flag, path, "--json"], field, refuse=True)


# The app's URL parameters


def _query_cases() -> list[tuple[str, str]]:
    from explorer.state import FIELDS

    texts = ("", "nan", "inf", "-1", "0", "1e400", "1" + "0" * 30, "x" * 5000, "\x00", "1.5",
             "２", "0x10", "True", "[1]", "../../etc/passwd")  # fmt: skip
    rng = random.Random(38)
    return [(f.key, rng.choice(texts)) for f in FIELDS for _ in range(2)]


@pytest.mark.parametrize(("key", "text"), _query_cases())
def test_app_url_parameters_never_raise_and_name_what_they_refuse(key, text):
    from explorer.state import START, from_query

    values, problems = from_query({key: text})
    if key in problems:
        assert problems[key].startswith(key) and values[key] == START[key]
    else:
        assert values[key] is not None


@pytest.mark.parametrize("text", ["", "!!!", "eJw=", "A" * 10_000, "eJwLycgsVgCi4pTE3ILUIgA="])
def test_a_damaged_config_link_is_one_reason(text):
    from explorer.state import decode_config

    try:
        decode_config(text)
    except ValueError as err:
        assert "config" in str(err)


RUNS_FILES = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "list": "[1, 2]",
    "runs-text": json.dumps({"runs": "many"}),
    "run-not-object": json.dumps({"runs": [1]}),
    "no-mfu": json.dumps({"runs": [{"id": "a", "source": {"name": "x"}, "model": "llama3-8b",
                                    "hardware": "H100", "gpus": 8}]}),
    "null-batch": json.dumps({"runs": [{"id": "b", "model": "llama3-8b", "hardware": "H100",
                                        "gpus": 8, "global_batch": None, "mfu": 0.4}]}),
    "unknown-device": json.dumps({"runs": [{"id": "c", "model": "llama3-8b",
                                            "hardware": "Abacus 9000", "gpus": 8,
                                            "mfu": 0.4}]}),
    "empty": "",
}  # fmt: skip


@pytest.mark.parametrize("name", [*RUNS_FILES, "fifo", "dev-zero", "folder"])
def test_a_hostile_runs_file_is_one_line_or_rows_that_say_why(tmp_path, name, capsys):
    """``python -m validate.published --runs FILE``: a file it cannot read is one line and
    exit 2; a run it cannot map is a row saying which field stops it, and a file none of
    whose runs it can map exits 1, saying so."""
    import validate.published.__main__ as published

    if name in RUNS_FILES:
        path = tmp_path / f"{name}.json"
        path.write_text(RUNS_FILES[name])
    else:
        path = Path(_special(tmp_path, name))
    rc = published.main(["--runs", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if rc == 2:
        assert err.count("\n") == 1 and "runs" in err, err
    else:
        assert rc == 1 and "none of the" in err and "could be predicted" in err
        rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").open()]
        assert rows and all(r["status"] == "error" and r["error"] for r in rows), rows


PLAN = ["plan", "--model", "cs336-small", "--seq", "512", "--frameworks", "fsdp2",
        "--recompute", "none", "--json"]  # fmt: skip
LISTS_AND_RANGES = [
    (["--hardware", "h100-sxm,,b200", "--gpus", "2", "--global-batch", "8"], "hardware", False),
    (["--hardware", "h100-sxm,nonexistent", "--gpus", "2", "--global-batch", "8"], "hardware",
     True),
    (["--hardware", ",", "--gpus", "2", "--global-batch", "8"], "hardware", True),
    (["--hardware", "h100-sxm," * 2000, "--gpus", "2", "--global-batch", "8"], "hardware", False),
    (["--hardware", "h100-sxm", "--gpus", "2", "--global-batch", "64:8"], "global_batch", True),
    (["--hardware", "h100-sxm", "--gpus", "2", "--global-batch", ":"], "global_batch", True),
    (["--hardware", "h100-sxm", "--gpus", "2", "--global-batch", "1:" + "9" * 30], "global_batch",
     True),
    (["--hardware", "h100-sxm", "--gpus", "2", "--global-batch", "0:8"], "global_batch", True),
    (["--hardware", "h100-sxm", "--gpus", "2", "--global-batch-tokens", "1000:100"],
     "global_batch_tokens", True),
    (["--hardware", "h100-sxm", "--gpus", "2", "--global-batch", "8", "--micro-batches", "0,1"],
     "micro_batches", True),
    (["--hardware", "h100-sxm", "--gpus", "2", "--global-batch", "8", "--micro-batches",
      ",".join(["1"] * 5000)], "micro_batches", False),
    (["--hardware", "h100-sxm,b200", "--gpus", "2", "--global-batch", "8", "--price-per-hour",
      "1,nan"], "price_per_hour", True),
    (["--hardware", "h100-sxm", "--max-gpus", str(2**53), "--global-batch", "8"], "max_gpus", True),
    (["--hardware", "h100-sxm", "--max-gpus", "0", "--global-batch", "8"], "max_gpus", True),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "field", "refuse"), LISTS_AND_RANGES)
def test_plans_lists_and_ranges_are_answered_or_refused_in_one_line(flags, field, refuse):
    """Issue 60: plan's comma lists and LO:HI ranges, hostile, answer (valid JSON) or are
    refused naming the field; none hangs (each of these returns in seconds)."""
    _assert_clean([*PLAN[:1], *PLAN[1:], *flags], field, refuse)


BOUNDED = [
    (["serve", "--model", "llama3-8b", "--context", "4096", "--rope-scaling", "1e308", "--json"],
     "rope_scaling"),
    (["serve", "--model", "mixtral-8x7b", "--context", "4096", "--hardware", "cpu", "--json"],
     None),
    (["rl", "--model", "qwen3-8b", "--gpus", "8", "--prompts", "64", "--input", "512",
      "--output", "2048", "--samples", "1000000", "--json"], "prompts"),
    (["rl", "--model", "qwen3-8b", "--gpus", "8", "--prompts", str(10**12), "--input", "512",
      "--output", "2048", "--json"], "prompts"),
    (["padding", "--model", "llama3-8b", "--seq", "4096", "--distribution",
      "lognormal:median=700,sigma=1", "--samples", str(10**12), "--json"], "samples"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "field"), BOUNDED)
def test_the_issue_60_reproducers_answer_or_refuse_in_one_line(argv, field):
    _assert_clean(argv, field or "", field is not None)
