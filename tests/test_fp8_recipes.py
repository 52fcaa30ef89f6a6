"""fp8 scaling recipes (``TrainSpec.fp8_recipe``, ``costmodel/single/fp8.py``): the rowwise
rate re-derived from the H100 measurement, each recipe's effect on the GEMM time only, and
the refusals naming the field."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

import costmodel as cm
from costmodel import SpecError
from costmodel.cli import main as cli
from costmodel.single import fp8

MEASURED = Path(__file__).parents[1] / "validate/measured/h100-sxm-gemms-2026-11-26"


def _fp8_seconds(scaling: str) -> dict[tuple[int, int, int], float]:
    rows = [json.loads(line) for line in (MEASURED / "gemm_shapes.jsonl").read_text().splitlines()]
    return {(r["m"], r["k"], r["n"]): r["seconds"] for r in rows
            if r["kind"] == "scaled_mm" and r["dtype"] == scaling}  # fmt: skip


def test_rowwise_rate_is_the_h100_measurement():
    """torch._scaled_mm with rowwise scales over the same 36 shapes as tensorwise: the
    median of tensorwise seconds over rowwise seconds, 0.954 (0.925 at k = 768)."""
    tensor, row = _fp8_seconds("tensorwise"), _fp8_seconds("rowwise")
    assert tensor.keys() == row.keys() and len(row) == 36
    ratios = [tensor[s] / row[s] for s in row]
    assert statistics.median(ratios) == pytest.approx(fp8.RECIPES["rowwise"].gemm_rate, abs=5e-4)
    shallow = [tensor[s] / row[s] for s in row if s[1] == 768]
    assert statistics.median(shallow) == pytest.approx(0.925, abs=5e-3)


def _estimate(recipe: str, hardware: str = "h100-sxm") -> cm.Estimate:
    return cm.estimate("llama3-8b", hardware=hardware, gpus=8, fsdp=8, framework="fsdp2",
                       batch=32, seq=8192, precision="fp8", fp8_recipe=recipe)  # fmt: skip


def test_rowwise_slows_the_gemms_by_its_rate_and_nothing_else():
    tensor, row = _estimate("tensorwise"), _estimate("rowwise")
    assert tensor["memory_bytes_per_device.peak"] == row["memory_bytes_per_device.peak"]
    assert tensor["flops.step"] == row["flops.step"]
    assert row["time_s.step"] > tensor["time_s.step"]
    # the GEMMs' seconds grow by 1/0.954 at most (attention and memory-bound work do not)
    assert row["time_s.compute"] / tensor["time_s.compute"] < 1 / 0.954 + 1e-9


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_unmeasured_recipes_are_priced_as_tensorwise_and_say_so(recipe):
    est = _estimate(recipe, hardware="b200")
    assert est["time_s.step"] == _estimate("tensorwise", hardware="b200")["time_s.step"]
    assert "tensorwise's rate, not measured" in fp8.note(recipe)


def test_mxfp8_needs_block_scaling_matrix_cores():
    with pytest.raises(SpecError, match=r"fp8_recipe mxfp8 needs .* h100-sxm has none"):
        _estimate("mxfp8")
    assert _estimate("mxfp8", hardware="gb200")["time_s.step"] > 0


def test_a_recipe_needs_fp8():
    with pytest.raises(SpecError, match=r"fp8_recipe rowwise .* needs precision fp8"):
        cm.TrainSpec(precision="bf16-mixed", fp8_recipe="rowwise")
    with pytest.raises(SpecError, match="fp8_recipe"):
        cm.TrainSpec(precision="fp8", fp8_recipe="per-channel")


def test_gemm_rate_takes_arrays_of_names():
    rates = fp8.gemm_rate(np.array(["tensorwise", "rowwise", "mxfp8"]))
    assert rates.tolist() == [1.0, 0.954, 1.0]


def test_the_cli_names_the_recipe_and_its_default(capsys):
    args = ["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8"]
    args += ["--precision", "fp8"]
    assert cli([*args]) == 0
    assert "fp8, tensorwise scaling (one scale per tensor) (default; --fp8-recipe)" in (
        capsys.readouterr().out)  # fmt: skip
    assert cli([*args, "--fp8-recipe", "rowwise"]) == 0
    assert "fp8, rowwise scaling (a scale per row and column);" in capsys.readouterr().out
    assert cli([*args, "--fp8-recipe", "mxfp8"]) == 2
    assert "--fp8-recipe mxfp8 needs matrix cores" in capsys.readouterr().err
