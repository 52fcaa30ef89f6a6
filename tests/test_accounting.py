"""The formulas equal torch's own counters exactly (meta device, full scale).

Counters: parameter ``numel``; ``FlopCounterMode`` forward and backward, by op; bytes alive
after forward and bytes packed by ``saved_tensors_hooks``, de-duplicated by storage.
Tolerance: zero. Every per-layer expression is linear in L, so the complete matrix of kinds
runs on two-layer versions of each structure's first preset, the other presets on
:data:`CORE` (every precision, kernel and recompute policy once), at full depth for the
three reference models (2.7B's every kind) and one configuration of every preset. The
complete matrix of every preset runs with ``-m slow``.
"""

from __future__ import annotations

import itertools

import pytest

from costmodel import PRESETS, TrainSpec, get_model
from costmodel.engine.quantities import structure_of
from costmodel.specs.checks import SpecError
from validate.probes.accounting import compare

PRECISIONS = ("fp32", "bf16-mixed")
KERNELS = ("naive", "flash")
RECOMPUTE = ("none", "full", "selective", "selective-op")
MATRIX = list(itertools.product(PRECISIONS, KERNELS, RECOMPUTE))
FULL_SCALE = ("cs336-2.7b", "llama3-8b", "xxl")


def assert_exact(model, train):
    if model.moe and train.recompute == "selective-op":  # refused by the spec layer
        with pytest.raises(SpecError, match="selective-op"):
            compare(model, train)
        return
    rows = compare(model, train)
    wrong = [r for r in rows if r["predicted"] != r["measured"]]
    assert not wrong, wrong
    assert len(rows) >= 6  # params, FLOPs, live, saved and copies at least


WIDEST = {"deepseek-v3"}
"""Two-layer DeepSeek-V3 takes 3 s a kind on 2 cores: its matrix runs in the slow suite (its
code paths run at small sizes in ``test_mla`` and in DeepSeek-V2-Lite's matrix here)."""


def _by_cost(name: str) -> list:
    return [pytest.mark.slow] if name in WIDEST else []


def _structure(name: str) -> tuple:
    return structure_of(get_model(name), TrainSpec(), None)


REPRESENTATIVE = {next(n for n in PRESETS if _structure(n) == s)
                  for s in {_structure(n) for n in PRESETS}}  # fmt: skip
"""The first preset of each structure (kinds and flags: ``engine.quantities.structure_of``):
13 of 28. Presets of one structure run the same code paths at other sizes."""
CORE = [("fp32", "naive", "none"), ("bf16-mixed", "flash", "full"),
        ("bf16-mixed", "naive", "selective"), ("fp32", "flash", "selective-op")]  # fmt: skip
"""Every precision, kernel and recompute policy once: what every preset runs by default."""


def _cost(name: str, kind: tuple | None = None, second_shape: bool = False) -> list:
    """The slow suite's: DeepSeek-V3's matrix; beyond each structure's first preset, its
    second shape and the kinds past :data:`CORE` (the full matrix of every preset in
    ``-m slow``)."""
    wide = name in WIDEST
    repeat = name not in REPRESENTATIVE and (second_shape or (kind is not None and
                                                              kind not in CORE))  # fmt: skip
    return [pytest.mark.slow] if wide or repeat else []


SHAPES = [
    pytest.param(name, batch, seq, *kind, marks=_cost(name, kind, (batch, seq) == (1, 64)))
    for name in PRESETS
    for batch, seq in ((1, 64), (3, 200))
    if not get_model(name).moe or batch == 3
    for kind in MATRIX
]  # MoE presets: one shape (their loops are slow)


@pytest.mark.parametrize(("name", "batch", "seq", "precision", "attention", "recompute"), SHAPES)
def test_every_preset_two_layers(name, batch, seq, precision, attention, recompute):
    model = _few_experts(_two_layers(name))
    assert_exact(
        model,
        TrainSpec(
            batch=batch, seq=seq, precision=precision, attention=attention, recompute=recompute
        ),
    )


def _two_layers(name):
    """A preset cut to two blocks (at most one of them dense, as DeepSeek-V3 leads with 3)."""
    model = get_model(name)
    return model.replace(n_layers=2, dense_layers=min(model.dense_layers, 1))


def _few_experts(model):
    """An MoE preset with at most 8 routed experts (top-k at most 2): the same code paths,
    every count linear in the experts, and the matrix runs in seconds; the full-scale tests
    run the presets as they are."""
    if model.n_experts <= 8:
        return model
    return model.replace(n_experts=8, experts_per_token=min(2, model.experts_per_token))


@pytest.mark.parametrize(("name", "precision", "attention", "recompute"), [
    pytest.param(name, *kind, marks=[pytest.mark.slow] if name != FULL_SCALE[0]
                 and kind not in CORE else [])
    for name in FULL_SCALE for kind in MATRIX
])  # fmt: skip
def test_reference_models_full_scale(name, precision, attention, recompute):
    assert_exact(
        get_model(name),
        TrainSpec(batch=2, seq=256, precision=precision, attention=attention, recompute=recompute),
    )


FAST_FULL_SCALE = [name for name in PRESETS if get_model(name).n_experts <= 32]
"""Presets counted at full depth in the default run (Mixtral's 8 and gpt-oss-20b's 32
experts among them); those of 60 to 256 experts (Qwen1.5-MoE, DeepSeek-MoE, DeepSeek-V2-
Lite, Qwen3-30B-A3B, DeepSeek-V3: 18 s to 80 s each on 2 cores) in the slow one below."""


@pytest.mark.parametrize("name", FAST_FULL_SCALE)
def test_every_preset_full_scale(name):
    assert_exact(
        get_model(name),
        TrainSpec(
            batch=1, seq=128, precision="bf16-mixed", attention="naive", recompute="selective"
        ),
    )


def test_pure_bf16_full_scale():
    for attention in KERNELS:
        assert_exact(
            get_model("llama3-8b"),
            TrainSpec(batch=2, seq=128, precision="bf16", attention=attention),
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(PRESETS) - set(FAST_FULL_SCALE)))
def test_large_moe_presets_full_scale(name):
    test_every_preset_full_scale(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAST_FULL_SCALE)
def test_every_preset_full_scale_every_kind(name):
    for precision, attention, recompute in MATRIX:
        assert_exact(
            get_model(name),
            TrainSpec(
                batch=2, seq=128, precision=precision, attention=attention, recompute=recompute
            ),
        )


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=_by_cost(n) or ([] if n in REPRESENTATIVE else [pytest.mark.slow]))
    for n in PRESETS
])  # fmt: skip
@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_dropout_two_layers(name, recompute):
    """Branch and attention-probability dropout (Megatron's 0.1): bool masks, the dropped
    probabilities, and no early stop before a branch's last matmul under recomputation."""
    for precision in PRECISIONS:
        assert_exact(
            _few_experts(_two_layers(name)),
            TrainSpec(
                batch=2,
                seq=96,
                precision=precision,
                attention="naive",
                recompute=recompute,
                dropout=0.1,
            ),
        )


WINDOWED = {
    "all-local": {"sliding_window": 24},  # Mistral-7B v0.1's pattern
    "mixed": {"sliding_window": 24, "global_every": 2},  # Gemma 2's, gpt-oss's
    "mixed-every-3": {"sliding_window": 7, "global_every": 3},  # Gemma 3's, shorter
}


@pytest.mark.parametrize("pattern", WINDOWED)
@pytest.mark.parametrize(("precision", "attention", "recompute"), MATRIX)
def test_sliding_window_two_and_three_layers(pattern, precision, attention, recompute):
    """Local layers: the naive kernel's bool band mask, the CPU flash kernel's additive one
    (kept by its backward), one for all local layers beside the global layers' causal mask;
    FLOPs counted dense. Windows shorter than the sequence."""
    model = get_model("llama3-8b").replace(n_layers=3, **WINDOWED[pattern])
    train = TrainSpec(batch=2, seq=80, precision=precision, attention=attention,
                      recompute=recompute)  # fmt: skip
    assert_exact(model, train)


@pytest.mark.parametrize("attention", KERNELS)
def test_sliding_window_under_mla_and_dropout(attention):
    """The window is the core's: MLA's core takes the same masks; attention dropout (naive
    on CPU) drops the band's probabilities."""
    mla = _two_layers("deepseek-v2-lite").replace(sliding_window=16, global_every=2)
    assert_exact(_few_experts(mla), TrainSpec(batch=2, seq=64, attention=attention))
    dense = get_model("llama3-8b").replace(n_layers=2, sliding_window=16, global_every=2)
    assert_exact(dense, TrainSpec(batch=2, seq=48, attention="naive", dropout=0.1))


@pytest.mark.parametrize(
    "name", [pytest.param("gpt-oss-20b", marks=pytest.mark.slow), "gemma-3-4b"]
)  # gpt-oss's 32 experts take 7 s a kernel on 2 cores: in the slow suite
@pytest.mark.parametrize("attention", KERNELS)
def test_windowed_presets_full_scale(name, attention):
    """Full depth, sequences past the window (gpt-oss: 128; Gemma 3's window cut to 64)."""
    model = get_model(name)
    if model.sliding_window > 128:
        model = model.replace(sliding_window=64)
    assert_exact(model, TrainSpec(batch=1, seq=256, precision="bf16-mixed", attention=attention))
