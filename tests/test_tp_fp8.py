"""Tensor-parallel bytes under an fp8 recipe: what sequence parallelism gathers quantised."""

from __future__ import annotations

import pytest

from costmodel import TrainSpec, estimate, get_model
from costmodel.catalog.hardware import get_hardware
from costmodel.specs.parallel import ParallelSpec

H100 = get_hardware("h100-sxm")


def _tp_bytes(train: TrainSpec, **layout) -> float:
    return estimate(get_model("cs336-small"), train, ParallelSpec(**layout), H100)["comm_bytes.tp"]


def test_fp8_gathers_the_sequence_parallel_inputs_quantised():
    """Under sequence parallelism a block's all-gathers move the matmuls' inputs, which an
    fp8 recipe gathers quantised (1 byte a value; Transformer Engine's LayerNormLinear,
    torchao's Float8ColwiseParallel), while the reduce-scatters stay bf16: the blocks'
    bytes fall to (1 + 2) / (2 + 2) of bf16's. Without sequence parallelism the block
    outputs' all-reduces stay bf16 either way."""
    b, t, d, layers = 16, 512, 768, 12
    ring = 2 * 3 / 4
    vocab = ring * (4 * b * t * d + 2 * b * t * d + 3 * 4 * b * t)
    blocks = 4 * layers * ring * 2 * b * t * d  # bf16 (tests/test_parallel.py)
    fp8 = TrainSpec(batch=16, seq=512, precision="fp8")
    assert _tp_bytes(fp8, tp=4) == pytest.approx(blocks + vocab)
    gathered = _tp_bytes(fp8, tp=4, sequence_parallel=True)
    assert gathered == pytest.approx(blocks * 3 / 4 + vocab)
