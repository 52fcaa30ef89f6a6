"""Sliding-window (local/global) attention, the attention kind of ``costmodel.kinds.attention``.

The pair counts against brute-force counts of the masks the reference model builds
(``validate.reference.core.attention_masks``) and of the tiles a FlashAttention-2 kernel
visits (Dao 2023, Sec. 3.1.1: wholly masked tiles skipped); time below the causal model's
at long sequences and equal to it when the window covers the sequence; estimate and sweep
in agreement over arrays of windows; the rules that refuse what is not modelled. Exact
counts against torch are in ``tests/test_accounting.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
import torch

from costmodel import ParallelSpec, TrainSpec, estimate, get_hardware, get_model, sweep
from costmodel.engine.quantities import structure_of
from costmodel.kinds.attention import KINDS
from costmodel.kinds.attention.window import TILE
from costmodel.specs.checks import SpecError
from costmodel.symbols import L_loc, T, W_sw, local_layers, values_for
from validate.reference.core import attention_masks

CAUSAL, WINDOW = KINDS["causal"], KINDS["window"]
H100 = get_hardware("h100-sxm")


def _pairs(expr: sp.Expr, seq: int, window: int = 0) -> sp.Expr:
    return sp.sympify(expr).subs({T: seq, W_sw: window})


def _kept(mask: torch.Tensor) -> int:
    """Pairs a naive kernel's bool mask keeps (it marks the dropped ones)."""
    return int((~mask).sum())


@pytest.mark.parametrize("seq", [1, 7, 16, 33])
@pytest.mark.parametrize("window", [1, 2, 5, 16, 40])
def test_useful_pairs_count_the_reference_models_masks(seq, window):
    causal, band = attention_masks("naive", [False, True], window, seq, torch.float32, "cpu")
    assert _pairs(WINDOW.useful_pairs(), seq, window) == _kept(band)
    assert _pairs(CAUSAL.useful_pairs(), seq) == _kept(causal) == seq * (seq + 1) // 2
    i, j = np.indices((seq, seq))  # the definition: keys i - W < j <= i
    assert _kept(band) == int(np.sum((j <= i) & (j > i - window)))
    _, additive = attention_masks("flash", [True], window, seq, torch.bfloat16, "cpu")
    assert additive.dtype == torch.bfloat16 and int(torch.isfinite(additive).sum()) == _kept(band)


def _tile_pairs(seq: int, window: int, tile: int) -> int:
    """Pairs a FlashAttention-2 kernel computes with square tiles: every tile holding an
    unmasked pair, whole (brute force over the tiles)."""
    n = -(-seq // tile)
    total = 0
    for r in range(n):
        rows = range(r * tile, min(seq, (r + 1) * tile))
        for c in range(n):
            cols = range(c * tile, min(seq, (c + 1) * tile))
            if any(i - window < j <= i for i in rows for j in cols):
                total += len(rows) * len(cols)
    return total


@pytest.mark.parametrize("blocks", [1, 2, 3, 5])
def test_fused_pairs_are_the_tiles_visited_on_the_causal_footing(blocks):
    """For a window of whole tiles, the tiles visited less the diagonal tiles' masked halves
    (which the causal count, half of T x T, leaves out) equal the window's fused pairs
    to TILE²/8 per sequence (the docstring's claim)."""
    seq = 8 * TILE
    window = blocks * TILE
    diagonal_halves = seq * TILE // 2
    visited = _tile_pairs(seq, window, TILE) - diagonal_halves
    assert visited - _pairs(WINDOW.fused_pairs(), seq, window) == TILE**2 // 8
    assert _tile_pairs(seq, seq, TILE) - diagonal_halves == _pairs(CAUSAL.fused_pairs(), seq)


@pytest.mark.parametrize("seq", [1, 100, 4096, 32768])
def test_fused_pairs_never_exceed_the_causal_ones_and_equal_them_past_the_sequence(seq):
    causal = _pairs(CAUSAL.fused_pairs(), seq)
    for window in (1, 64, 128, 1000, seq - 1, seq, seq + 1, 10 * seq):
        fused = _pairs(WINDOW.fused_pairs(), seq, max(window, 1))
        assert fused <= causal
        if window >= seq:
            assert fused == causal
            assert _pairs(WINDOW.useful_pairs(), seq, window) == _pairs(CAUSAL.useful_pairs(), seq)


def test_naive_pairs_are_dense_and_torch_counts_flops_densely():
    assert _pairs(WINDOW.naive_pairs(), 77, 5) == _pairs(CAUSAL.naive_pairs(), 77) == 77**2
    train = TrainSpec(batch=2, seq=4096)
    dense = estimate(get_model("gemma-2-2b", sliding_window=0), train).values
    local = estimate(get_model("gemma-2-2b"), train.replace(seq=8192)).values
    windowed = estimate(get_model("gemma-2-2b"), train).values
    assert windowed["flops.step"] == dense["flops.step"]  # FlopCounterMode: dense
    assert local["flops.conventions.useful"] < 4 * dense["flops.conventions.useful"]


def _step(model, seq, **layout):
    train = TrainSpec(batch=8, seq=seq, recompute="selective")
    return estimate(model, train, ParallelSpec(fsdp=8, **layout), H100).values


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma-3-4b", "mistral-7b-v0.1"])
def test_a_window_is_faster_at_long_sequences(name):
    model = get_model(name)
    windowed, full = _step(model, 32768), _step(model.replace(sliding_window=0), 32768)
    assert windowed["time_s.step"] < full["time_s.step"]
    assert windowed["roofline.attn_core.time_s"] < full["roofline.attn_core.time_s"]
    assert windowed["flops.conventions.useful"] < full["flops.conventions.useful"]


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma-2-2b", "mistral-7b-v0.1"])
def test_a_window_covering_the_sequence_costs_what_causal_attention_does(name):
    """W >= T: the same pairs, the same core time and model FLOPs; the step differs only by
    the fused kernel's additive band mask, written and read once per micro-batch (T² bf16
    elements, ~1e-4 of these steps)."""
    model = get_model(name)
    seq = 4096
    windowed = _step(model.replace(sliding_window=seq), seq)
    full = _step(model.replace(sliding_window=0), seq)
    for key in ("roofline.attn_core.time_s", "roofline.attn_core.backward_s"):
        assert windowed[key] == pytest.approx(full[key], rel=1e-12)
    assert windowed["flops.conventions.useful"] == full["flops.conventions.useful"]
    mask = windowed["memory_bytes.activations_by_op.attn_mask"]
    assert mask == 2 * seq * seq  # bf16 additive band, one for all local layers
    assert windowed["time_s.step"] == pytest.approx(full["time_s.step"], rel=1e-3)
    assert windowed["time_s.step"] >= full["time_s.step"]


@pytest.mark.parametrize(
    ("name", "windows", "every"),
    [
        ("mistral-7b-v0.1", [0, 64, 1000, 4096, 10**6], 0),
        ("gemma-2-2b", [1, 128, 4096, 8192], 2),
        ("llama3-8b", [0, 128, 128, 2048], [0, 0, 2, 3]),
    ],
)
def test_estimate_and_sweep_agree_over_windows(name, windows, every):
    model, seq = get_model(name), 8192
    keys = ["time_s.step", "flops.conventions.useful", "memory_bytes_per_device.peak"]
    layout = {"fsdp": 8, "batch": 16, "seq": seq, "recompute": "selective"}
    grid = sweep(name, hardware=H100, quantities=keys, sliding_window=windows,
                 global_every=every, grad_accum=1, **layout)  # fmt: skip
    everies = np.broadcast_to(every, len(windows))
    for i, (window, ge) in enumerate(zip(windows, everies, strict=True)):
        spec = model.replace(sliding_window=int(window), global_every=int(ge))
        one = _step_like(spec, layout)
        for key in keys:
            assert grid[key][i] == pytest.approx(one[key], rel=1e-12), (key, window)


def _step_like(model, layout):
    train = TrainSpec(batch=layout["batch"], seq=layout["seq"], recompute=layout["recompute"])
    return estimate(model, train, ParallelSpec(fsdp=layout["fsdp"]), H100).values


def test_the_kind_is_part_of_the_structure():
    train = TrainSpec()
    causal, local = get_model("llama3-8b"), get_model("mistral-7b-v0.1")
    mixed = get_model("gemma-2-2b")
    keys = {structure_of(m, train) for m in (causal, local, mixed)}
    assert len(keys) == 3
    assert structure_of(local, train) == structure_of(local.replace(sliding_window=9), train)
    expr = estimate(mixed, train).expr("flops.conventions.useful")
    assert {W_sw, L_loc} <= expr.free_symbols
    assert not {W_sw, L_loc} & estimate(causal, train).expr("flops.conventions.useful").free_symbols


@pytest.mark.parametrize("layers", [1, 2, 5, 26, 34])
@pytest.mark.parametrize(("window", "every"), [(0, 0), (4, 0), (4, 1), (4, 2), (4, 6), (4, 99)])
def test_local_layer_count_follows_the_pattern(layers, window, every):
    model = get_model("cs336-small", n_layers=layers, sliding_window=window, global_every=every)
    local = sum(model.is_local(i) for i in range(layers))
    assert values_for(model)[L_loc] == local == local_layers(layers, window, every)
    counts = local_layers(np.array([layers]), np.array([window]), np.array([every]))
    assert counts.tolist() == [local]


def test_gemma_and_gpt_oss_patterns():
    gemma3 = get_model("gemma-3-4b")
    assert [i for i in range(gemma3.n_layers) if not gemma3.is_local(i)] == [5, 11, 17, 23, 29]
    oss = get_model("gpt-oss-20b")
    assert [oss.is_local(i) for i in range(4)] == [True, False, True, False]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"global_every": 2}, "global_every"),
        ({"sliding_window": -1}, "sliding_window"),
        ({"sliding_window": 4, "global_every": -2}, "global_every"),
        ({"sliding_window": 2.5}, "sliding_window"),
    ],
)
def test_window_fields_are_checked(changes, field):
    with pytest.raises(SpecError) as err:
        get_model("llama3-8b", **changes)
    assert err.value.field == field


def test_a_window_needs_attention_and_no_ring():
    with pytest.raises(SpecError) as err:
        get_model("xxl", sliding_window=4)
    assert err.value.field == "sliding_window"
    model, train = get_model("gpt-oss-20b"), TrainSpec(batch=8, seq=4096)
    with pytest.raises(SpecError, match="ring attention") as err:
        estimate(model, train, ParallelSpec(fsdp=4, cp=2), H100)
    assert err.value.field == "cp"
    with pytest.raises(SpecError) as swept:
        sweep("gpt-oss-20b", hardware=H100, cp=[1, 2], fsdp=4, batch=8, seq=4096)
    assert swept.value.field == "cp" and str(swept.value) == str(err.value)


def test_no_window_drops_the_pattern():
    model = get_model("gpt-oss-20b").replace(sliding_window=0)
    assert (model.sliding_window, model.global_every) == (0, 0)
    with pytest.raises(SpecError) as err:
        sweep("gpt-oss-20b", sliding_window=[0, 128], quantities=["params.total"])
    assert err.value.field == "global_every"


def test_masks_kept_by_kind():
    """Naive: a bool causal mask for the global layers, a bool band for the local ones;
    flash: only the local layers' additive band, in the compute dtype."""
    train = TrainSpec(batch=1, seq=1000)
    part = "memory_bytes.activations_by_op.attn_mask"
    for name, naive, flash in (("llama3-8b", 1, None), ("mistral-7b-v0.1", 1, 2),
                               ("gemma-2-2b", 2, 2)):  # fmt: skip
        model = get_model(name)
        assert estimate(model, train.replace(attention="naive"))[part] == naive * 1000**2
        values = estimate(model, train).values
        assert values.get(part) == (flash and flash * 1000**2)


def test_presets_state_their_published_sizes():
    """gpt-oss model card: 20.91B and 116.83B parameters (the router's bias and the
    attention sinks apart: 2,304 and 6,912); Gemma 2 2B's checkpoint: 2,614,341,888 (its
    post-norms apart: 26 x 2 x 2304)."""

    def total(name):
        return estimate(get_model(name), TrainSpec())["params.total"]

    assert round(total("gpt-oss-20b") / 1e9, 2) == 20.91
    assert round(total("gpt-oss-120b") / 1e9, 2) == 116.83
    assert total("gemma-2-2b") == 2_614_341_888 - 26 * 2 * 2304


def test_no_formula_module_branches_on_the_attention_kind():
    """The formulas ask ``costmodel.kinds.attention``: no module of single/, parallel/ or
    frameworks/ reads the window fields or names a kind (DESIGN.md, principle 9)."""
    import ast
    from pathlib import Path

    root = Path(__file__).parent.parent / "costmodel"
    found = []
    for folder in ("single", "parallel", "frameworks"):
        for path in sorted((root / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                fields = isinstance(node, ast.Attribute) and node.attr in (
                    "sliding_window", "global_every")  # fmt: skip
                named = isinstance(node, ast.Compare) and any(
                    isinstance(n, ast.Constant) and n.value in KINDS for n in ast.walk(node)
                )
                if fields or named:
                    found.append(f"{path.name}:{node.lineno}")
    assert not found
