"""Invariants over random valid configurations (issue 38): the planner's candidate layouts of
random (model, device, GPU count, batch, sequence, precision) questions (the models in
turn), every one that the rules accept, evaluated with the same compiled expressions as
``estimate``.

Run: ``.venv/bin/python benchmarks/fuzz_invariants.py [--configs 50000] [--seed 38]
[--out fuzz-results] [--all-presets]`` (``--all-presets``: every preset in turn, each asked
at least once, in place of the seven of :data:`MODELS`). Checks, per configuration or per
group of configurations that differ in one field only:

- ``0 < MFU <= HFU <= 1``;
- the peak holds at least the persistent state (parameters, master copy, optimizer);
- the memory table's lines (frozen weights, parameters, master, gradients, optimizer state,
  buffers, activations and the remainder line: transients, or the parts not alive at
  once) add up to the peak it prints, and the peak holds each part (which parts are alive
  together depends on the framework and the moment: FSDP's gathered compute copy is gone
  at the optimizer step, gradients are absent from a forward; under pipelining each line
  is the largest over the pipeline ranks);
- per-device activations do not depend on how the data-parallel ranks are split into
  replicas and shards (same framework, degrees, micro-batch and recompute);
- sharding divides exactly: what a ZeRO stage shards (1: master and optimizer state; 2 and
  3: gradients too; under autocast, whose fp32 parameters are the model's, the master at
  stage 3 only) per device times the shard degree (fsdp; Megatron's distributed
  optimizer: dp x fsdp) equals one device's whole state under the same framework (tp = pp
  = cp = ep = 1);
- recomputation is monotone: full recompute keeps no more activations than none, peaks no
  higher, and is never faster than none (the same layout otherwise).

Each question's counts are appended to ``OUT/draws.jsonl`` as it finishes (a rerun skips
the draws it holds); the summary prints each invariant's checks, failures and the worst
example.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.catalog.presets import PRESETS
from costmodel.engine.fit import MEMORY_PARTS, rest_at_peak

MODELS = ("cs336-small", "cs336-2.7b", "gpt2", "gemma-2-2b", "llama3-8b", "llama3-70b",
          "mixtral-8x7b")  # fmt: skip
DEVICES = ("h100-sxm", "a100-80gb", "mi300x", "b200", "tpu-v5p")
PRECISIONS = ("bf16-mixed", "fp16-mixed", "bf16", "fp8")
QUANTITIES = (
    "mfu",
    "hfu",
    "time_s.step",
    "memory_bytes_per_device.peak",
    "memory_bytes_per_device.params",
    "memory_bytes_per_device.master",
    "memory_bytes_per_device.grads",
    "memory_bytes_per_device.optimizer",
    "memory_bytes_per_device.activations",
    "memory_bytes_per_device.frozen",
    "memory_bytes_per_device.buffers",
)
TOL = 1e-9
LAYOUT_BUT_DATA = ("framework", "zero", "tp", "pp", "pp_interleave", "cp", "ep", "etp",
                   "micro_batch", "sequence_parallel", "ep_overlap", "ep_dispatcher")  # fmt: skip
"""The columns that fix a layout but for how its data-parallel ranks split into dp x fsdp
(and the recompute policy)."""


def question(rng: random.Random, draw: int, models: tuple[str, ...] = MODELS) -> dict[str, Any]:
    """One random planning question; the ``models`` in turn, so that every one is asked
    within the first ``len(models)`` draws."""
    return {
        "model": models[draw % len(models)],
        "hardware": rng.choice(DEVICES),
        "gpus": rng.choice((1, 2, 4, 8, 16, 32, 64)),
        "batch": rng.choice((8, 16, 32, 64)),
        "seq": rng.choice((512, 1024, 2048, 4096)),
        "precision": rng.choice(PRECISIONS),
    }


def evaluate(q: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """(candidate columns, quantities) of every valid layout of ``q``; None if none."""
    from costmodel import TrainSpec, get_hardware, get_model
    from costmodel.engine.grid import SEARCHED
    from costmodel.engine.layouts import enumerate_layouts, valid_mask
    from costmodel.engine.options import PlanOptions
    from costmodel.engine.sweep import sweep
    from costmodel.single.precision import PRECISIONS as PREC
    from costmodel.specs.checks import SpecError

    model, hw = get_model(q["model"]), get_hardware(q["hardware"])
    try:
        train = TrainSpec(
            batch=q["batch"], seq=min(q["seq"], model.max_positions), precision=q["precision"]
        )
        hw.peak(PREC[q["precision"]].peak_dtype)
        options = PlanOptions(frameworks=("fsdp2", "megatron", "deepspeed", "reference"))
        cols = enumerate_layouts(model, train, hw, q["gpus"], options)
        ok = valid_mask(cols, model, train)
    except SpecError:
        return None
    if not ok.any():
        return None
    cols = {k: v[ok] for k, v in cols.items()}
    given = {k: getattr(train, k) for k in ("seq", "precision")}  # batch: a column
    searched = {k: v for k, v in cols.items() if k in SEARCHED}
    values = sweep(model, hardware=hw, quantities=QUANTITIES, **given, **searched)
    return cols, values


def _single_device(q: dict[str, Any], framework: str) -> dict[str, float] | None:
    """One device's whole state for ``q``'s model and precision under ``framework``."""
    from costmodel import estimate
    from costmodel.specs.checks import SpecError

    try:
        est = estimate(
            q["model"],
            hardware=q["hardware"],
            gpus=1,
            batch=1,
            seq=512,
            precision=q["precision"],
            framework=framework,
        )
    except SpecError:
        return None
    return {k: float(est[f"memory_bytes_per_device.{k}"]) for k in ("master", "grads", "optimizer")}


class Tally:
    def __init__(self) -> None:
        self.checks: dict[str, int] = defaultdict(int)
        self.fails: dict[str, int] = defaultdict(int)
        self.worst: dict[str, tuple[float, str]] = {}

    def check(self, name: str, ok: np.ndarray, excess: np.ndarray, where: str) -> None:
        ok = np.asarray(ok, dtype=bool)
        self.checks[name] += int(ok.size)
        bad = int((~ok).sum())
        if bad:
            self.fails[name] += bad
            i = int(np.argmax(np.where(ok, -np.inf, excess)))
            if excess[i] > self.worst.get(name, (-np.inf, ""))[0]:
                self.worst[name] = (float(excess[i]), f"{where} row {i}")

    def to_dict(self) -> dict[str, Any]:
        return {"checks": dict(self.checks), "fails": dict(self.fails), "worst": self.worst}


def _groups(cols: dict[str, np.ndarray], keys: tuple[str, ...]) -> np.ndarray:
    """An integer label per row: rows with equal ``keys`` share it."""
    table = np.array([[str(cols[k][i]) for k in keys] for i in range(len(cols["tp"]))])
    return np.unique(table, axis=0, return_inverse=True)[1].reshape(-1)


def check_all(q: dict[str, Any], cols: dict, v: dict, tally: Tally, where: str) -> None:
    mfu, hfu = v["mfu"], v["hfu"]
    tally.check(
        "0 < MFU <= HFU <= 1",
        (mfu > 0) & (mfu <= hfu * (1 + TOL)) & (hfu <= 1 + TOL),
        np.maximum(mfu - hfu, hfu - 1),
        where,
    )
    state = sum(v[f"memory_bytes_per_device.{k}"] for k in ("params", "master", "optimizer"))
    peak = v["memory_bytes_per_device.peak"]
    tally.check("peak >= persistent state", peak >= state * (1 - TOL), (state - peak) / peak, where)
    parts = {k: v[f"memory_bytes_per_device.{k}"] for k in MEMORY_PARTS}
    rows = range(len(peak))  # the remainder line as the tables compute it, row by row
    rest = np.array([rest_at_peak({k: float(e[i]) for k, e in v.items()}) for i in rows])
    printed = sum(parts.values()) + rest  # the table's lines, remainder included
    tally.check("memory table adds up to the peak", np.abs(printed - peak) <= TOL * peak,
                np.abs(printed / peak - 1), where)  # fmt: skip
    largest = np.max(np.stack(list(parts.values())), axis=0)
    tally.check("peak >= each part", largest <= peak * (1 + TOL), largest / peak - 1, where)
    acts = v["memory_bytes_per_device.activations"]
    same = _groups(cols, (*LAYOUT_BUT_DATA, "recompute"))
    for label in np.unique(same):
        rows = np.flatnonzero(same == label)
        rel = np.abs(acts[rows] / acts[rows[0]] - 1)
        tally.check("activations independent of replicas", rel <= TOL, rel, where)
    _check_recompute(cols, v, tally, where)
    _check_sharding(q, cols, v, tally, where)


def _check_recompute(cols: dict, v: dict, tally: Tally, where: str) -> None:
    keys = (*LAYOUT_BUT_DATA, "dp", "fsdp")
    label = _groups(cols, keys)
    none = {int(label[i]): i for i in np.flatnonzero(cols["recompute"] == "none")}
    full = [
        (none[int(label[i])], i)
        for i in np.flatnonzero(cols["recompute"] == "full")
        if int(label[i]) in none
    ]
    if not full:
        return
    a, b = np.array(full).T
    acts = v["memory_bytes_per_device.activations"]
    tally.check(
        "full recompute keeps <= none", acts[b] <= acts[a] * (1 + TOL), acts[b] / acts[a] - 1, where
    )
    peak = v["memory_bytes_per_device.peak"]
    tally.check(
        "full recompute peaks <= none", peak[b] <= peak[a] * (1 + TOL), peak[b] / peak[a] - 1, where
    )
    step = v["time_s.step"]
    tally.check(
        "full recompute never faster than none",
        step[b] >= step[a] * (1 - TOL),
        1 - step[b] / step[a],
        where,
    )


def _check_sharding(q: dict, cols: dict, v: dict, tally: Tally, where: str) -> None:
    from costmodel.specs.frameworks import trait

    flat = (cols["tp"] == 1) & (cols["pp"] == 1) & (cols["cp"] == 1) & (cols["ep"] == 1)
    if not flat.any():
        return
    terms = {
        1: ("master", "optimizer"),
        2: ("master", "optimizer", "grads"),
        3: ("master", "optimizer", "grads"),
    }
    for fw in np.unique(cols["framework"][flat]):
        whole = _single_device(q, str(fw))
        # Megatron's distributed optimizer spans every data-parallel rank; ZeRO elsewhere
        # shards over the fsdp group and replicates over dp
        degree = cols["fsdp"] * (cols["dp"] if fw == "megatron" else 1)
        for zero, sharded in terms.items():
            if trait(str(fw), "autocast") and zero < 3:  # its fp32 parameters are the model's:
                sharded = tuple(t for t in sharded if t != "master")  # sharded at stage 3 only
            rows = flat & (cols["framework"] == fw) & (cols["zero"] == zero)
            if whole is None or not rows.any():
                continue
            for term in sharded:
                got = v[f"memory_bytes_per_device.{term}"][rows] * degree[rows]
                rel = np.abs(got - whole[term]) / max(whole[term], 1.0)
                tally.check(f"sharding divides exactly ({term})", rel <= 1e-6, rel, where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--out", default="fuzz-results")
    parser.add_argument("--all-presets", action="store_true",
                        help="every preset in turn, each asked at least once")  # fmt: skip
    args = parser.parse_args()
    models = tuple(PRESETS) if args.all_presets else MODELS
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "draws.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                rec = json.loads(line)
                done[rec["draw"]] = rec
            except (json.JSONDecodeError, KeyError):
                continue
    rng, total, draw, start = random.Random(args.seed), 0, 0, time.perf_counter()
    tallies = []
    while total < args.configs or draw < len(models):
        q = question(rng, draw, models)
        if draw in done:
            rec = done[draw]
        else:
            rec = _draw(q, draw)
            with log.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        total += rec["configs"]
        tallies.append(rec)
        print(
            f"[{draw}] {total:,}/{args.configs:,} configurations ({q['model']} on "
            f"{q['gpus']} {q['hardware']}, {q['precision']}): {rec['configs']} layouts, "
            f"{sum(rec['fails'].values())} failures, {time.perf_counter() - start:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        draw += 1
    _summary(tallies, total)


def _draw(q: dict[str, Any], draw: int) -> dict[str, Any]:
    result = evaluate(q)
    tally = Tally()
    if result is not None:
        check_all(q, *result, tally, f"draw {draw} {q}")
    n = 0 if result is None else len(result[0]["tp"])
    return {"draw": draw, "question": q, "configs": n, **tally.to_dict()}


def _summary(records: list[dict[str, Any]], total: int) -> None:
    checks, fails, worst = defaultdict(int), defaultdict(int), {}
    for rec in records:
        for k, n in rec["checks"].items():
            checks[k] += n
        for k, n in rec["fails"].items():
            fails[k] += n
        for k, (x, where) in rec["worst"].items():
            if x > worst.get(k, (-np.inf, ""))[0]:
                worst[k] = (x, where)
    print(f"\n{total:,} configurations in {len(records)} questions")
    print(f"{'invariant':<48} {'checks':>10} {'failures':>9}  worst")
    for k in sorted(checks):
        w = f"{worst[k][0]:.3g} at {worst[k][1][:90]}" if k in worst else ""
        print(f"{k:<48} {checks[k]:>10,} {fails[k]:>9,}  {w}")


if __name__ == "__main__":
    main()
