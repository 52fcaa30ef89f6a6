"""Every entry point agrees on one configuration (issue 34, item 6).

Seeded random configurations — dense (MHA, GQA, learned positions, GELU, LayerNorm,
biases, sliding-window layers), mixture-of-experts and MLA models, every framework, every
layout degree — go through ``estimate``, a one-row ``sweep``, the planner's evaluation of
that layout (``plan.evaluate_layout``) and the CLI's ``estimate --json``. A valid one gets the same
number for every output key from all four (to float64 rounding: the sweep evaluates in
numpy floats, ``estimate`` in exact Python integers where it can); an invalid one is
refused by all four with the same sentence, which names the same field. The structures
(the kinds and flags that change the expressions) come from a fixed seeded pool, so the
suite compiles a bounded number of them; sizes and degrees are drawn freely.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import numpy as np
import pytest

from costmodel import ModelSpec, ParallelSpec, TrainSpec, estimate, get_hardware, sweep
from costmodel.cli import as_flags, main, make_parser
from costmodel.engine.plan import evaluate_layout
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.parallel import FRAMEWORKS

N_VALID = 1000
N_INVALID = 1000
HARDWARE = "h100-sxm"
RTOL = 1e-12
"""float64 rounding: numpy and Python's math evaluate the same expressions."""

MODEL_KINDS = ("mha", "gqa", "gpt", "moe", "mla", "window")
FLAGS = ("zero", "sequence_parallel", "grad_reduce_fp32", "async_tp", "reshard_after_forward",
         "ep_overlap")  # fmt: skip

ESTIMATE = make_parser()._subparsers._group_actions[0].choices["estimate"]
"""The estimate command's parser (its flags name the fields in its errors)."""


def _structures(rng: np.random.Generator, n: int = 24) -> list[dict[str, Any]]:
    """A fixed pool of structures: kinds, flags and whether pp / interleaving are on."""
    pool = []
    for i in range(n):
        entry = {
            "model": MODEL_KINDS[i % len(MODEL_KINDS)],
            "framework": FRAMEWORKS[i % len(FRAMEWORKS)],
            "precision": rng.choice(["bf16-mixed", "fp32", "bf16", "fp16-mixed", "fp8"]),
            "recompute": rng.choice(["none", "full", "selective"]),
            "attention": rng.choice(["flash", "flash", "naive"]),
            "elementwise": rng.choice(["fused", "fused", "eager"]),
            "zero": int(rng.choice([1, 2, 3, 3])),
            "sequence_parallel": bool(rng.random() < 0.3),
            "pp": bool(rng.random() < 0.4),
            "interleave": bool(rng.random() < 0.3),
            "overlap": rng.choice(["max", "max", "sum"]),
            # None: unset, the framework's own default (fp32 under FSDP2)
            "grad_reduce_fp32": (None, False, True)[int(rng.random() * 3)],
            "reshard_after_forward": bool(rng.random() < 0.8),
            "async_tp": bool(rng.random() < 0.2),
            "ep_overlap": bool(rng.random() < 0.2),
        }
        if entry["framework"] == "handwritten":  # what it runs: ZeRO-3, no recompute, no pp
            entry.update(zero=3, recompute="none", pp=False)
        if not trait(entry["framework"], "zero_stages"):  # its own stage (3: not given)
            entry["zero"] = 3
        pool.append(entry)
    return pool


def _model(kind: str, rng: np.random.Generator) -> dict[str, Any]:
    heads = int(rng.choice([4, 8]))
    head_dim = int(rng.choice([16, 32]))
    out: dict[str, Any] = {
        "vocab": int(rng.choice([256, 1000])),
        "d_model": heads * head_dim,
        "n_layers": int(rng.choice([2, 3, 4, 6, 8])),
        "n_heads": heads,
        "d_ff": int(rng.choice([64, 96, 128])),
    }
    if kind == "gqa":
        out["n_kv_heads"] = int(rng.choice([1, 2, heads // 2]))
    if kind == "gpt":
        out.update(pos="learned", ffn="gelu", norm="layernorm", bias=True, max_positions=256)
    if kind == "moe":
        out.update(n_experts=int(rng.choice([4, 8])), experts_per_token=int(rng.choice([1, 2])),
                   d_ff_expert=int(rng.choice([32, 64])),
                   n_shared_experts=int(rng.choice([0, 1])),
                   dense_layers=int(rng.choice([0, 1])))  # fmt: skip
    if kind == "window":  # sliding-window layers, all local or every k-th one global
        out.update(n_kv_heads=heads // 2, sliding_window=int(rng.choice([16, 64, 512])),
                   global_every=int(rng.choice([0, 2, 3])))  # fmt: skip
    if kind == "mla":
        out.update(kv_lora_rank=32, rope_head_dim=8, q_lora_rank=int(rng.choice([0, 48])),
                   head_dim=16, v_head_dim=16)  # fmt: skip
    return out


def _config(structure: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """Flat inputs (the CLI's and ``inputs.build``'s keys) of one random configuration."""
    s = structure
    pp = int(rng.choice([2, 4])) if s["pp"] else 1
    one_axis = rng.random() < 0.3  # sharding alone: what the hand-written FSDP runs
    train = {
        "batch": int(rng.choice([8, 16, 32, 64])),
        "seq": int(rng.choice([64, 128, 256])),
        "grad_accum": int(rng.choice([1, 2, 4])),
        **{k: str(s[k]) for k in ("precision", "recompute", "attention", "elementwise")},
    }
    layout = {
        "framework": str(s["framework"]),
        "dp": 1 if one_axis else int(rng.choice([1, 2])),
        "fsdp": int(rng.choice([1, 2, 4])),
        "tp": 1 if one_axis else int(rng.choice([1, 2, 4])),
        "pp": pp,
        "pp_interleave": int(rng.choice([2, 3])) if s["interleave"] and pp > 1 else 1,
        "cp": 1 if one_axis else int(rng.choice([1, 1, 2])),
        "ep": int(rng.choice([1, 2, 4])) if s["model"] == "moe" and not one_axis else 1,
        **{k: s[k] for k in FLAGS if s[k] is not None},
        "overlap": str(s["overlap"]),
    }
    return {**_model(s["model"], rng), **train, **layout}


BREAKERS = (  # one change that some rule refuses, applied to a random share of configurations
    {"framework": "handwritten", "dp": 2},
    {"finetune": "lora", "tp": 2},
    {"recompute": "selective-op", "n_experts": 4, "experts_per_token": 1},
    {"pos": "learned", "max_positions": 32},
    {"n_kv_heads": 3},
    {"n_experts": 2, "experts_per_token": 3},
    {"n_experts": 4, "experts_per_token": 1, "dense_layers": 9},
    {"capacity_factor": 1.5},
    {"grad_accum": 3},
    {"pp": 16},
    {"ep_overlap": True, "framework": "fsdp2", "n_experts": 4, "experts_per_token": 1, "ep": 2},
    {"kv_lora_rank": 16, "rope_head_dim": 8, "tp": 2},
    {"cp": 2, "attention": "naive"},
    {"framework": "megatron", "zero": 2},  # a stage a framework that shards its own way lacks
)


def _split(config: dict[str, Any]) -> tuple[dict, dict, dict]:
    names = [set(ModelSpec.__dataclass_fields__), set(TrainSpec.__dataclass_fields__),
             set(ParallelSpec.__dataclass_fields__)]  # fmt: skip
    return tuple({k: v for k, v in config.items() if k in n} for n in names)  # type: ignore[return-value]


def _argv(config: dict[str, Any]) -> list[str]:
    argv = ["estimate", "--hardware", HARDWARE, "--json"]
    for key, value in config.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else ("--untied" if key == "tied" else f"--no-{flag[2:]}"))
        else:
            argv += [flag, str(value)]
    return argv


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {prefix: obj}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else key))
    return out


# Each entry point: config -> {key: number}, or raises SpecError / returns the CLI's sentence.
def via_estimate(config: dict[str, Any]) -> dict[str, float]:
    m, t, p = _split(config)
    hw = get_hardware(HARDWARE)
    return dict(estimate(ModelSpec(**m), TrainSpec(**t), ParallelSpec(**p), hw).values)


def via_sweep(config: dict[str, Any]) -> dict[str, float]:
    m, t, p = _split(config)
    rows = {
        k: [v] if isinstance(v, int) and not isinstance(v, bool) else v
        for k, v in {**t, **p}.items()
    }  # sizes and degrees as one-row grids
    out = sweep(ModelSpec(**m), hardware=HARDWARE, **rows)  # its inputs, then quantities
    numbers = {k: np.asarray(v) for k, v in out.items() if np.asarray(v).dtype.kind == "f"}
    return {k: float(v[0]) for k, v in numbers.items() if not np.isnan(v[0])}


def via_plan(config: dict[str, Any]) -> dict[str, float]:
    m, t, p = _split(config)
    hw = get_hardware(HARDWARE)
    return evaluate_layout(ModelSpec(**m), TrainSpec(**t), ParallelSpec(**p), hw)


def via_cli(config: dict[str, Any]) -> dict[str, float] | str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(_argv(config))
    if code != 0:
        return err.getvalue().strip().split(": error: ", 1)[-1]
    return {k: v for k, v in _flat(json.loads(out.getvalue())).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip


def _refusal(entry: Any, config: dict[str, Any]) -> tuple[str, str] | None:
    try:
        result = entry(config)
    except SpecError as err:
        return err.field, str(err)
    return ("cli", result) if isinstance(result, str) else None


def _configs() -> tuple[list[dict], list[tuple[dict, SpecError]]]:
    """Seeded valid and invalid configurations (validity as ``estimate`` judges)."""
    rng = np.random.default_rng(34)
    pool = _structures(rng)
    valid: list[dict] = []
    invalid: list[tuple[dict, SpecError]] = []
    for _ in range(40 * (N_VALID + N_INVALID)):
        if len(valid) >= N_VALID and len(invalid) >= N_INVALID:
            break
        config = _config(pool[int(rng.integers(len(pool)))], rng)
        if rng.random() < 0.25:
            config.update(BREAKERS[int(rng.integers(len(BREAKERS)))])
        try:
            via_estimate(config)
        except SpecError as err:
            if len(invalid) < N_INVALID:
                invalid.append((config, err))
            continue
        if len(valid) < N_VALID:
            valid.append(config)
    return valid, invalid


@pytest.fixture(scope="module")
def configs() -> tuple[list[dict], list[tuple[dict, SpecError]]]:
    return _configs()


def test_the_configurations_cover_every_kind(configs):
    valid, invalid = configs
    assert len(valid) == N_VALID and len(invalid) == N_INVALID
    assert {c["framework"] for c in valid} == set(FRAMEWORKS)
    assert any(c.get("n_experts") for c in valid) and any(c.get("kv_lora_rank") for c in valid)
    assert any(c.get("sliding_window") for c in valid)
    assert any(c["pp"] > 1 for c in valid) and any(c["tp"] > 1 for c in valid)
    assert any(c["cp"] > 1 for c in valid) and any(c["ep"] > 1 for c in valid)
    fields = {err.field for _, err in invalid}
    assert len(fields) >= 15, fields  # many different rules refuse


def test_valid_configurations_agree_everywhere(configs):
    valid, _ = configs
    for config in valid:
        want = via_estimate(config)
        for name, entry in (("sweep", via_sweep), ("plan", via_plan), ("cli", via_cli)):
            got = entry(config)
            keys = set(want) if name != "plan" else set(got)
            assert keys <= set(got) and keys <= set(want), (name, config, keys ^ set(got))
            bad = [k for k in keys if not np.isclose(got[k], want[k], rtol=RTOL, atol=0)]
            assert not bad, (name, config, {k: (got[k], want[k]) for k in bad[:3]})


def test_invalid_configurations_are_refused_alike(configs):
    _, invalid = configs
    for config, err in invalid:
        want = (err.field, str(err))
        for entry in (via_sweep, via_plan):
            assert _refusal(entry, config) == want, (entry.__name__, config)
        flags = as_flags(str(err), ESTIMATE)  # the CLI names flags where the API names fields
        assert _refusal(via_cli, config) == ("cli", flags), config
