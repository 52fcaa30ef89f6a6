"""sweep(): broadcasting, agreement with estimate(), and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import TrainSpec, estimate, get_model, sweep


def test_grid_broadcasts_and_matches_estimate():
    batch, seq = np.array([1, 2, 4])[:, None], np.array([128, 1024])[None, :]
    out = sweep("cs336-2.7b", batch=batch, seq=seq, precision="bf16-mixed")
    assert out["memory_bytes.peak"].shape == (3, 2)
    for i, bb in enumerate([1, 2, 4]):
        for j, tt in enumerate([128, 1024]):
            est = estimate(get_model("cs336-2.7b"), TrainSpec(batch=bb, seq=tt))
            for key in ("memory_bytes.peak", "flops.step", "memory_bytes.activations"):
                assert out[key][i, j] == pytest.approx(est[key], rel=1e-12)


def test_model_sizes_sweep_rederive_head_dim():
    out = sweep("cs336-small", d_model=[768, 1536], n_heads=[12, 24])
    small = estimate(get_model("cs336-small"), TrainSpec())["params.total"]
    wide = estimate(get_model("cs336-small", d_model=1536, n_heads=24), TrainSpec())
    np.testing.assert_allclose(out["params.total"], [small, wide["params.total"]])


def test_quantities_filter_and_scalar_shape():
    out = sweep("gpt2", quantities=["flops.step"])
    assert list(out) == ["flops.step"] and out["flops.step"].shape == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": [1, 0]}, "batch must be >= 1 everywhere"),
        ({"batch": [6], "grad_accum": 4}, "grad_accum must divide batch"),
        ({"seq": [0.5]}, "seq must hold integers"),
        ({"precision": ["fp32", "bf16"]}, "precision must be scalar"),
        ({"colour": 3}, "unknown field"),
        ({"n_kv_heads": [5]}, "n_kv_heads must divide n_heads"),
        ({"quantities": ["flops.nope"]}, "unknown quantity"),
    ],
)
def test_bad_sweeps_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sweep("cs336-small", **kwargs)


def test_learned_positions_checked_over_the_grid():
    with pytest.raises(ValueError, match="max_positions"):
        sweep("gpt2", seq=[512, 4096])
