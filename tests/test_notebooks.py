"""Notebooks are executed top to bottom; their own asserts check their answers."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    # generous limits: a kernel is a new Python process, which a loaded 2-core machine may
    # take minutes to start (its 60 s default failed under load); a cell is not timed here
    NotebookClient(
        nb, timeout=1800, startup_timeout=900, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()  # fmt: skip
    outputs = "".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
    )
    assert "Traceback" not in outputs
    if path.name == "memory_and_flops.ipynb":
        # By hand, bf16-mixed naive, B = 4: alpha = L·2·b·H + 1 (mask) = 8,193 bytes/T²;
        # beta = L·b·(20·D + 8·F + 8) + b·(4D+4) + 2·b·D + 4·b·V + 16·b + 4·d_h = 17,262,224.
        assert "8193 T^2 + 17262224 T" in outputs
        assert "S^2 dominates for T > 2,107" in outputs
        # FLOPs: 4·B·D·T² per layer vs 2·B·T·(4D² + 3DF) per layer plus 2·B·T·D·V.
        assert "exceed all other matmuls for T > 20,636" in outputs
    if path.name == "xxl_tpu_v5p.ipynb":
        # 16 bytes x 219,848,638,464 parameters; 44 H100s of 80 GB for the state alone.
        assert "3,517,578,215,424 B" in outputs and "fp32 state alone: 44" in outputs
        # (c) by hand in tests/test_parallel.py::test_xxl_critical_batch_by_hand.
        assert "B* = 25,302 tokens overall, 395.3 per device" in outputs
        assert "step 755.8 ms" in outputs  # sum rule: twice T_math at B*
    if path.name == "offload_and_padding.ipynb":
        # fp32 master and moments (12 B/parameter) do not fit 70 GB of host memory
        assert "bf16-mixed, optimizer state on the host: host_budget must be >=" in outputs
        assert "34 rounds of 2 sequence(s) = 16,384 tokens" in outputs  # the published plan
        assert "fits: {'device_ok': True, 'host_ok': True}" in outputs
        assert "99,087 of 131,072 tokens are padding: 75.6%" in outputs
    if path.name == "mixtral_expert_parallel.ipynb":
        # 4 micro-batches x 32 MoE blocks x 4 all-to-alls of 4,096 x 2 x 4,096 bf16, 7/8 sent
        assert "28.00 GiB (by hand) = 28.00 GiB (costmodel)" in outputs
        assert "fp32 master + gradients + Adam over 8 GPUs: 87.0 GiB" in outputs
    if path.name == "llama3_lora_qlora_24gb.ipynb":
        # PEFT's count for r 16 on every linear; QLoRA's 4 + 0.127 bits (Sec. 3)
        assert "trainable: 41,943,040 (by hand) = 41,943,040 (costmodel)" in outputs
        assert "at 4.127 bits" in outputs
        assert "QLoRA frozen weights: 5.31 GiB (by hand) = 5.31 GiB (costmodel)" in outputs
    if path.name == "serving_and_rl.ipynb":
        assert "131,072 B per token (by hand) = 131,072 B (costmodel)" in outputs
        assert "70,272 B per token (by hand) = 70,272 B (costmodel)" in outputs
        assert "generation share:" in outputs
    if path.name == "first_steps.ipynb":
        # the formula evaluated at the public value map is the estimate's step time (issue 35,
        # item 7; by xreplace, issue 58: .subs took 25-32 s)
        assert re.search(r"step time from the formula ([\d.]+) s = \1 s \(estimate\)", outputs)
        assert "d/dT with sp.Symbol('T'): 0" in outputs  # the assumption trap, shown
        assert "seq  8192: step" in outputs and "max seq " in outputs
