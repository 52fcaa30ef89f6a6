"""sweep(): broadcasting, agreement with estimate(), and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import ParallelSpec, SpecError, TrainSpec, estimate, get_hardware, get_model, sweep


def test_grid_broadcasts_and_matches_estimate():
    batch, seq = np.array([1, 2, 4])[:, None], np.array([128, 1024])[None, :]
    out = sweep("cs336-2.7b", batch=batch, seq=seq, precision="bf16-mixed", grad_accum=1)
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
        ({"batch": [1, 0]}, r"batch must be in \[1, 2\^53\] everywhere \(got 0\)"),
        ({"batch": [6], "grad_accum": 4}, "grad_accum must divide batch"),
        ({"seq": [0.5]}, "seq must hold integers"),
        ({"precision": ["fp32", "fp64"]}, "precision must be one of"),
        ({"tp": [1, 5]}, "hardware is required"),
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


def test_kinds_vary_across_the_grid_grouped_by_structure():
    """Precision and recomputation as arrays: each point equals its own estimate."""
    out = sweep("cs336-small", precision=["fp32", "bf16-mixed"], recompute=[["none"], ["full"]],
                grad_accum=1)  # the spec's own, as the estimates below  # fmt: skip
    for i, rec in enumerate(["none", "full"]):
        for j, prec in enumerate(["fp32", "bf16-mixed"]):
            one = estimate(get_model("cs336-small"), TrainSpec(precision=prec, recompute=rec))
            assert out["memory_bytes.peak"][i, j] == one["memory_bytes.peak"]
            assert out["flops.step"][i, j] == one["flops.step"]


def test_layouts_sweep_equals_estimate_and_applies_layout_rules():
    """ParallelSpec fields as arrays (pp crosses the pipelined/unpipelined structures)."""
    hw = get_hardware("h100-sxm")
    model = get_model("llama3-8b")
    fsdp, pp = np.array([[1], [2], [4]]), np.array([1, 2, 4])
    out = sweep(model, hardware=hw, fsdp=fsdp, pp=pp, tp=2, batch=64, grad_accum=4, seq=4096)
    for i, f in enumerate([1, 2, 4]):
        for j, p in enumerate([1, 2, 4]):
            one = estimate(model, TrainSpec(batch=64, grad_accum=4, seq=4096),
                           ParallelSpec(fsdp=f, pp=p, tp=2), hw)  # fmt: skip
            for key in ("memory_bytes_per_device.peak", "time_s.step", "mfu"):
                assert out[key][i, j] == pytest.approx(one[key], rel=1e-12)
    with pytest.raises(SpecError, match="tp must divide n_heads") as err:
        sweep(model, hardware=hw, tp=[1, 3])
    assert err.value.field == "tp"


def test_micro_batch_arrays_mean_grad_accum():
    mb = np.array([1, 2, 4])
    keys = ("time_s.step", "memory_bytes_per_device.peak")
    by_mb = sweep("gpt2", hardware="h100-sxm", quantities=keys, batch=32, fsdp=4, micro_batch=mb)
    by_ga = sweep("gpt2", hardware="h100-sxm", quantities=keys, batch=32, fsdp=4,
                  grad_accum=32 // (4 * mb))  # fmt: skip
    for k in keys:
        assert np.array_equal(by_mb[k], by_ga[k])
    with pytest.raises(SpecError, match="micro_batch"):
        sweep("gpt2", hardware="h100-sxm", batch=32, fsdp=4, micro_batch=np.array([3]))
    with pytest.raises(SpecError, match="not both"):
        sweep("gpt2", hardware="h100-sxm", batch=32, micro_batch=1, grad_accum=1)


def test_sweep_takes_estimates_defaults_and_crosses_gpus_with_batches():
    """Issue 60's probe: with the same keywords ``estimate`` held one sequence a micro-batch
    (fsdp 8, batch 64: 47.7 GB, fits) where ``sweep`` took grad_accum 1 (242.9 GB, does not
    fit); ``gpus`` beside a batch list raised a numpy broadcasting error; and ``dp`` with
    ``gpus`` that ``estimate`` refuses was filled with fsdp."""
    import costmodel

    kw = {"hardware": "h100-sxm", "seq": 4096, "framework": "fsdp2"}
    one = costmodel.estimate("llama3-8b", fsdp=8, batch=64, **kw)
    grid = costmodel.sweep("llama3-8b", fsdp=8, batch=64, **kw)
    for key in ("memory_bytes_per_device.peak", "time_s.step"):
        assert grid[key] == pytest.approx(one[key], rel=1e-12)
    assert bool(grid["fits"])
    crossed = costmodel.sweep("llama3-8b", gpus=np.array([8, 16])[:, None],
                              batch=np.array([64, 128])[None, :], **kw)  # fmt: skip
    for i, g in enumerate((8, 16)):
        for j, b in enumerate((64, 128)):
            at = costmodel.estimate("llama3-8b", gpus=g, batch=b, **kw)
            assert crossed["time_s.step"][i, j] == pytest.approx(at["time_s.step"], rel=1e-12)
    assert costmodel.sweep("llama3-8b", gpus=8, batch=[64, 128], **kw)["time_s.step"].shape == (2,)
    with pytest.raises(SpecError, match="must equal gpus") as err:
        costmodel.sweep("llama3-8b", gpus=16, dp=2, batch=64, **kw)
    assert err.value.field == "gpus"


def test_sweep_takes_a_memory_headroom_as_estimate_does():
    """Issue 60's sixth probe: sweep refused memory_headroom, so its fits column always
    used 0.9 where estimate takes the user's."""
    import costmodel

    kw = {"hardware": "h100-sxm", "gpus": 8, "batch": 64, "seq": 8192, "framework": "fsdp2"}
    for headroom in (0.8, 0.95):
        grid = costmodel.sweep("llama3-8b", memory_headroom=headroom, **kw)
        one = costmodel.estimate("llama3-8b", memory_headroom=headroom, **kw)
        assert bool(grid["fits"]) == one.fit().fits
    assert not costmodel.sweep("llama3-8b", memory_headroom=0.8, **kw)["fits"]
    with pytest.raises(SpecError, match="memory_headroom"):
        costmodel.sweep("llama3-8b", memory_headroom=1.5, **kw)
