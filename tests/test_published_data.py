"""Published runs are data (issue 34, item 4): a runs file in the documented schema
(shared/published-runs/README.md) maps with devices written as their sources write them;
a run missing or misstating a needed field is one report line naming the run and the
field, never a traceback; the device alias table covers every device the shipped data
names; and no code in validate/published branches on a source's group or run id."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from costmodel import SpecError, TrainSpec, estimate, get_hardware
from costmodel.catalog.hardware import HARDWARE, resolve_device
from validate.published.__main__ import main
from validate.published.compare import rows_for
from validate.published.conventions import flops_per_sequence
from validate.published.corpus import CorpusError, case_of, load_runs

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "validate" / "published"
DATA = sorted((PACKAGE / "data").glob("*.json"))
_TPU = PACKAGE / "data" / "tpu.json"
UPSTREAM = ROOT.parent / "shared" / "published-runs" / "runs.json"

# The spellings the issue found unmapped, and others sources use, with the catalog entry.
SPELLINGS = {
    "H200 141GB": "h200",
    "V100 (DGX-2)": "v100-sxm2-32gb",
    "TPU v6e (Trillium)": "tpu-v6e",
    "H100 SXM5 96GB": "h100-sxm-96gb",
    "H100 80GB SXM": "h100-sxm",
    "A100 80GB": "a100-80gb",
    "A100-SXM4-40GB": "a100-40gb",
    "MI300X": "mi300x",
    "B200": "b200",
    "GB200 NVL72": "gb200",
    "TPU v5p": "tpu-v5p",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "8x A100 80 GB": "a100-80gb",
}


def _run(**changes: Any) -> dict[str, Any]:
    """Llama-3-8B, FSDP over 8 devices, in the documented schema only (none of the fields
    validate/published/fields.py adds): ``changes`` are dotted paths, None deletes."""
    run: dict[str, Any] = {
        "id": "schema-llama3-8b-8gpu",
        "group": "schema",
        "source": {"repo": "example/repo", "path": "README.md", "table": "Table 1"},
        "model": {"d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8,
                  "d_ff": 14336, "vocab": 128256, "seq": 8192},
        "hardware": "H100 80GB SXM",
        "n_gpus": 8,
        "parallelism": {"dp": 1, "fsdp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": None},
        "micro_batch": 1,
        "global_batch": 16,
        "precision": "bf16",
        "activation_recompute": "full",
        "torch_compile": False,
        "measured": {"tokens_per_s_per_gpu": 5000.0},
    }  # fmt: skip
    for path, value in changes.items():
        *parents, key = path.split(".")
        node = run
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return run


def _hardware_strings() -> set[str]:
    files = [*DATA, *([UPSTREAM] if UPSTREAM.exists() else [])]
    return {run["hardware"] for path in files for run in load_runs(path)}


@pytest.mark.parametrize(("text", "name"), sorted(SPELLINGS.items()))
def test_the_alias_table_resolves_how_sources_write_devices(text, name):
    assert resolve_device(text) == name


def test_every_device_in_the_shipped_data_resolves():
    strings = _hardware_strings()
    assert len(strings) >= 14  # 11 in runs.json, 1 in holdout.json, 3 in holdout_moe.json
    resolved = {text: resolve_device(text) for text in strings}
    assert resolved["H100 (DGX, 80GB)"] == "h100-sxm"
    assert resolved["GB200 (DGX-GB200 NVL72)"] == "gb200"
    assert resolved["a100_40gb"] == "a100-40gb"
    torchtitan = next(t for t in strings if t.startswith("H100 SXM HBM2e 96GB"))
    assert resolved[torchtitan] == "h100-sxm-96gb"  # not "H100" at 80 GB: the text says 96
    assert set(resolved.values()) <= set(HARDWARE)


def test_catalog_names_resolve_to_themselves_and_unknown_devices_are_named():
    for name in HARDWARE:
        assert resolve_device(name) == name
    with pytest.raises(SpecError, match="'H100 40GB'") as err:
        resolve_device("H100 40GB")
    assert err.value.field == "hardware"
    with pytest.raises(SpecError, match="Gaudi"):
        resolve_device("Gaudi 3")
    with pytest.raises(SpecError):  # get_hardware still takes catalog names and paths only
        get_hardware("H100 80GB SXM")


@pytest.mark.parametrize(
    ("text", "name", "precision"),
    [("H200 141GB", "h200", "bf16"), ("V100 (DGX-2)", "v100-sxm2-32gb", "fp16 (--fp16)"),
     ("TPU v6e (Trillium)", "tpu-v6e", "bf16"), ("H100 SXM5 96GB", "h100-sxm-96gb", "bf16")],
)  # fmt: skip
def test_a_documented_schema_run_maps_with_the_devices_sources_write(text, name, precision):
    """The four spellings the issue found unmapped (26 of 66 runs), in a file with none of
    costmodel's added fields: mapped with generic defaults, each said in the assumptions."""
    case = case_of(_run(hardware=text, precision=precision))
    assert case.hardware.name == name
    assert case.parallel.framework == "fsdp2" and case.train.recompute == "full"
    assert any("framework not stated: fsdp2 (generic default)" in a for a in case.assumptions)
    [row] = rows_for(_run(hardware=text, precision=precision))
    assert row["status"] == "ok" and row["predicted"] > 0


def test_an_mfu_converts_with_the_stated_convention_and_peak():
    """0.5 MFU of the device's dense bf16 peak (the generic default) under Megatron-Core's
    model FLOPs; a stated ``mfu_peak_flops`` and the 2021 convention move it as they say."""
    run = _run(**{"measured.tokens_per_s_per_gpu": None, "measured.mfu": 0.5})
    generic = case_of(run)
    assert any("mfu_peak_flops not stated: 9.894e+14" in a for a in generic.assumptions)
    halved = case_of({**run, "mfu_peak_flops": 989.4e12 / 2})
    ratio = halved.measured["tokens_per_s_per_gpu"] / generic.measured["tokens_per_s_per_gpu"]
    assert ratio == pytest.approx(0.5, rel=1e-12)
    hfu = case_of({**run, "flops_convention": "narayanan-2021"})
    assert hfu.measured["tokens_per_s_per_gpu"] < generic.measured["tokens_per_s_per_gpu"]


def test_palm_conventions_count_every_parameter_and_their_attention_share():
    """MaxText's TFLOP/s (PaLM App. B): 6·N·s plus 12, 6 or 0 x H·L·d_h·s² per sequence,
    N every parameter costmodel counts; checked on the shipped v5p 32B run's 328 TFLOP/s."""
    run = next(r for r in load_runs(_TPU) if r["id"] == "maxtext-v5p-32b-1xv5p-128")
    case = case_of(run)
    m, s = case.model, case.train.seq
    n = estimate(m, TrainSpec(batch=1, seq=s))["params.total"]
    core = m.n_heads * m.n_layers * m.head_dim * s**2
    expected = {"palm": 6 * n * s + 12 * core, "palm-causal": 6 * n * s + 6 * core,
                "six-n": 6 * n * s}  # fmt: skip
    for name, flops in expected.items():
        assert flops_per_sequence(name, m, s) == pytest.approx(flops, rel=1e-12)
    tokens = 328e12 / expected["palm-causal"] * s
    assert case.measured["tokens_per_s_per_gpu"] == pytest.approx(tokens, rel=1e-12)


BAD = [
    ("no-mfu", {"measured.tokens_per_s_per_gpu": None, "measured.hfu": 0.4}, "measured"),
    ("no-measured", {"measured": None}, "measured"),
    ("null-batch", {"global_batch": None}, "global_batch"),
    ("unknown-device", {"hardware": "Gaudi 3"}, "hardware"),
    ("str-gpus", {"n_gpus": "64"}, "n_gpus"),
    ("str-rate", {"measured.tokens_per_s_per_gpu": "5000"}, "measured.tokens_per_s_per_gpu"),
    ("negative-tp", {"parallelism.tp": -2}, "parallelism.tp"),
    ("null-d-model", {"model.d_model": None}, "model.d_model"),
    ("float-layers", {"model.n_layers": 32.5}, "model.n_layers"),
    ("bool-seq", {"model.seq": True}, "model.seq"),
    ("nan-memory", {"measured.memory_GiB": float("nan")}, "measured.memory_GiB"),
    ("str-parallelism", {"parallelism": "fsdp 8"}, "parallelism"),
    ("bad-kernel", {"attention_kernel": "fa9"}, "attention_kernel"),
    ("bad-convention", {"measured.tokens_per_s_per_gpu": None, "measured.mfu": 0.4,
                        "flops_convention": "chinchilla-2"}, "flops_convention"),
    ("uneven", {"n_gpus": 12}, "n_gpus"),
    ("int8", {"precision": "int8 (AQT int8 matmuls)"}, "precision"),
    ("unknown-preset", {"model.preset": "llama-9"}, "model.preset"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "changes", "field"), BAD, ids=[b[0] for b in BAD])
def test_a_run_missing_or_misstating_a_needed_field_is_one_line_naming_it(name, changes, field):
    run = _run(id=f"bad-{name}", **changes)
    with pytest.raises(CorpusError, match=re.escape(f"bad-{name}: {field}: ")):
        case_of(run)
    [row] = rows_for(run)
    assert row["status"] == "error" and row["case"] == f"bad-{name}"
    assert row["error"].startswith(f"bad-{name}: {field}: ")


def test_runs_that_are_not_objects_or_lack_an_id_are_named_too():
    for run, why in (("a string", "run"), (["a", "list"], "run"), (_run(id=None), "id")):
        [row] = rows_for(run)
        assert row["status"] == "error" and f": {why}: " in row["error"]


def test_the_report_lists_each_run_not_predicted(tmp_path, capsys):
    """``python -m validate.published`` on a file with one good run and each bad one: exit
    0, every bad run one line of report.md's "Runs not predicted" and of the progress."""
    runs = [_run()] + [_run(id=f"bad-{n}", **c) for n, c, _ in BAD]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    assert main(["--runs", str(path), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"Runs not predicted ({len(BAD)})" in report
    err = capsys.readouterr().err
    for name, _, field in BAD:
        assert sum(f"bad-{name}: {field}: " in line for line in report.splitlines()) == 1
        assert f"bad-{name}: not predicted (bad-{name}: {field}: " in err


def test_the_shipped_runs_state_every_field_they_use():
    """validate/published/data/*.json carry costmodel's fields for every run: no generic
    default is taken, and every fill is cited in the run's assumptions."""
    for path in DATA:
        for run in load_runs(path):
            case = case_of(run)
            taken = [a for a in case.assumptions if "generic default" in a]
            assert not taken, (run["id"], taken)
            assert run["assumptions"], run["id"]


def test_korthikanti_fills_are_data():
    """Korthikanti et al. 2022's runs: the README table gives MFU only; the sizes, GPUs and
    batch of Table 3 are the data's, cited, and the MFU converts at 312 TFLOP/s."""
    runs = {r["id"]: r for r in load_runs()}
    case = case_of(runs["korthikanti22-a100-22B"])
    assert (case.model.d_model, case.model.n_layers, case.model.n_heads) == (6144, 48, 64)
    assert case.n_gpus == 8 and case.train.batch == 4
    assert any(a.startswith("Korthikanti et al. 2022 Table 3") for a in case.assumptions)
    assert any("MFU 0.415 x 312 TFLOP/s" in a for a in case.assumptions)
    bare = copy.deepcopy(runs["korthikanti22-a100-22B"])
    del bare["model"]["d_model"]
    with pytest.raises(CorpusError, match=r"korthikanti22-a100-22B: model\.d_model: missing"):
        case_of(bare)


GROUP_WORDS = {"group", "id", "source"}


def _mentions(node: ast.AST) -> bool:
    """Whether an expression reads a run's group, id or source."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and sub.value in GROUP_WORDS:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in GROUP_WORDS:
            return True
        if isinstance(sub, ast.Name) and sub.id in GROUP_WORDS:
            return True
    return False


def _literal_text(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.Tuple | ast.List | ast.Set) and all(map(_literal_text, node.elts))


def test_no_code_branches_on_a_source_or_run_id():
    """No comparison of a group, id or source with text, no startswith/split/in on them,
    and no group name of the shipped data written in validate/published's code."""
    groups = {run["group"] for path in DATA for run in load_runs(path)}
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(map(_mentions, sides)) and any(map(_literal_text, sides)):
                    found.append(f"{path.name}:{node.lineno}: compares {ast.unparse(node)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                method = node.func.attr in ("startswith", "endswith", "split", "find")
                if method and _mentions(node.func.value):
                    found.append(f"{path.name}:{node.lineno}: parses {ast.unparse(node)}")
            if isinstance(node, ast.Constant) and node.value in groups:
                found.append(f"{path.name}:{node.lineno}: names group {node.value!r}")
    assert not found, "\n".join(found)


def test_a_runs_file_that_is_no_regular_file_or_no_json_is_refused(tmp_path):
    """issue 38: a FIFO given as --runs blocked forever; bad JSON says where it broke."""
    import os

    bad = tmp_path / "runs.json"
    bad.write_text('{"runs": [1,')
    with pytest.raises(CorpusError, match=r"runs: .* is not valid JSON"):
        load_runs(bad)
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.json"
        os.mkfifo(fifo)
        with pytest.raises(CorpusError, match="is not a regular file"):
            load_runs(fifo)


def test_a_run_states_what_its_recipe_executes():
    """Issue 57, item 2: what a recipe runs is a field of the run: its CUDA graphs, how its
    expert GEMMs launch, and the pipeline slots its split gives the embedding and the loss;
    a value the spec does not know is refused, naming the run's field."""
    moe = {r["id"]: r for r in load_runs(PACKAGE / "data" / "moe.json")}
    graphed = case_of(moe["mbridge-26.02-qwen3-30b-a3b-gb200-8gpu"]).parallel
    assert graphed.cuda_graphs == "partial" and graphed.expert_gemm == "framework"
    zoo = {r["id"]: r for r in load_runs(PACKAGE / "data" / "moe_modelzoo.json")}
    split = case_of(zoo["modelzoo-qwen3-235b-h100-256gpu-a2a-ep8-pp32-vpp3"]).parallel
    assert split.pp_split_embedding and split.pp_split_loss and split.pp * split.pp_interleave == 96
    for field, value in (("cuda_graphs", "sometimes"), ("expert_gemm", "cutlass")):
        bad = copy.deepcopy(moe["mbridge-26.02-qwen3-30b-a3b-gb200-8gpu"])
        bad[field] = value
        with pytest.raises(CorpusError, match=rf"mbridge-26.02-qwen3-30b-a3b-gb200-8gpu: {field}"):
            case_of(bad)
