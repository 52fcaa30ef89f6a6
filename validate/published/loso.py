"""Leave-one-source-out: every fitted parameter refitted without each source, that source
predicted by the refit (``python -m validate.published --loso``).

A *source* is one publisher's document: a training run's ``group`` (a release's performance
summary, a paper's table), a serving run's ``source``. A *target* is one measured number of
one run (tokens/s or memory per GPU, a serving metric). For each source S, the records of
``costmodel/catalog/data/fitted.json`` are refitted in their order on their fit runs less
S's (each fit sees the earlier records' refitted values; a record whose fit runs are all
S's takes its ``prior``), and S's targets are predicted with those values: their error is
the one a user of the model can expect on a source that was not fitted. A parameter whose
leave-one-source-out error is far above its in-sample error stands in for something of the
sources it was fitted on (Stone 1974, cross-validation; Hastie et al., Elements of
Statistical Learning, Sec. 7.10). Torch-free; estimates take about a millisecond, so every
fold is refitted in full.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from costmodel import SpecError, get_model
from costmodel.catalog.files import read_json
from costmodel.catalog.fitted import Fitted, apply, reads
from costmodel.kinds import ffn
from costmodel.specs.hardware import Hardware
from validate.published import serving
from validate.published.compare import predict
from validate.published.corpus import CorpusError, case_of, load_runs

Tune = Callable[[Hardware], Hardware]

ROOT = Path(__file__).resolve().parents[2]
TRAINING_FILES = tuple(sorted((ROOT / "validate/published/data").glob("*.json")))
SERVING_FILES = (serving.RUNS,)


@dataclass(frozen=True, eq=False)
class Target:
    """One measured number of one published run, and how to predict it."""

    source: str
    run: str
    quantity: str
    measured: float
    device: str
    traits: dict[str, Any]
    """``moe``, ``kind``, ``framework``, ``recompute`` and ``file`` (relative to the
    repository root), which a record's ``fit.where`` selects on."""
    predict: Callable[[Tune], float] = field(repr=False)

    @property
    def family(self) -> str:
        """``serving`` or ``training``: which estimate predicts it."""
        return "serving" if self.quantity == "serving" else "training"

    @property
    def category(self) -> str:
        """Where a headline figure counts it: dense or MoE training on GPUs or TPUs,
        memory, serving by the metric its source states (throughput, TTFT, TPOT, end to
        end; all of them pooled as ``serving``)."""
        if self.quantity == "serving":
            return f"serving ({serving.FAMILIES.get(self.traits.get('metric'), 'throughput')})"
        if self.quantity == "memory_bytes_per_gpu":
            return "memory"
        kind = "TPU" if self.traits["kind"] == "tpu" else "GPU"
        return f"{'MoE' if self.traits['moe'] else 'dense'} training ({kind})"


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def training_targets(path: Path) -> tuple[list[Target], list[str]]:
    """Every measured quantity of every run in a training corpus file, and one line per run
    that cannot be predicted."""
    targets, skipped = [], []
    for run in load_runs(path):
        try:
            case = case_of(run)
        except (CorpusError, SpecError, ValueError, KeyError) as err:
            skipped.append(str(err))
            continue
        traits = {"moe": ffn.routes(case.model), "kind": case.hardware.kind,
                  "framework": case.parallel.framework, "recompute": case.train.recompute,
                  "file": _relative(path)}  # fmt: skip

        def one(tune: Tune, quantity: str, case: Any = case) -> float:
            return float(predict(replace(case, hardware=tune(case.hardware)))[quantity])

        for quantity, measured in case.measured.items():
            targets.append(Target(case.group, case.id, quantity, float(measured),
                                  case.hardware.name, traits,
                                  lambda tune, q=quantity, f=one: f(tune, q)))  # fmt: skip
    return targets, skipped


def serving_targets(path: Path) -> tuple[list[Target], list[str]]:
    """Every run of a serving corpus file (its one metric, quantity ``serving``), at the
    batch its engine takes (computed once: it depends on memory alone)."""
    targets, skipped = [], []
    for i, run in enumerate(read_json(Path(path), "runs")["runs"]):
        rid = f"{run['source']}#{i} {run['model']} {run['hardware']} tp{run['tp']} " \
              f"{run['input']}/{run['output']} {run['metric']}"  # fmt: skip
        try:
            batch = serving.batch_of(run)
        except SpecError as err:
            skipped.append(f"{rid}: {err}")
            continue
        moe = ffn.routes(get_model(run["model"]))
        traits = {"moe": moe, "kind": "gpu", "framework": run["engine"], "recompute": "none",
                  "file": _relative(Path(path)), "metric": run["metric"]}  # fmt: skip

        def one(tune: Tune, run: dict[str, Any] = run, batch: int = batch) -> float:
            return float(serving.predict(run, tune, batch)["predicted"])

        targets.append(Target(run["source"], rid, "serving", float(run["measured"]),
                              run["hardware"], traits, one))  # fmt: skip
    return targets, skipped


def corpus(
    training: Iterable[Path] = TRAINING_FILES, serving_files: Iterable[Path] = SERVING_FILES
) -> tuple[list[Target], list[str]]:
    """The targets of every corpus file, and the runs that cannot be predicted."""
    targets, skipped = [], []
    for path in training:
        t, s = training_targets(Path(path))
        targets, skipped = targets + t, skipped + s
    for path in serving_files:
        t, s = serving_targets(Path(path))
        targets, skipped = targets + t, skipped + s
    return targets, skipped


def selects(record: Fitted, target: Target) -> bool:
    """Whether ``target`` is one of the runs ``record`` is fitted on."""
    fit = record.fit
    if target.quantity != fit.quantity or target.traits["file"] not in fit.files:
        return False
    for key, want in fit.where.items():
        have = target.device if key == "devices" else target.traits.get(key)
        if (have not in want) if key == "devices" else (have != want):
            return False
    return True


Assignment = dict[str, tuple[float, ...]]


class Predictions:
    """Each target's prediction under an assignment of the records' values, computed once
    per distinct value of the records that hold its device."""

    def __init__(self, records: dict[str, Fitted]) -> None:
        self.records = records
        self.memo: dict[tuple[int, tuple], float] = {}
        self.errors: dict[int, str] = {}
        """Why a target's prediction failed (its SpecError), by target."""

    def tune(self, assignment: Assignment) -> Tune:
        def tune(hw: Hardware) -> Hardware:
            for name, record in self.records.items():
                hw = apply(record, hw, assignment[name])
            return hw

        return tune

    def __call__(self, target: Target, assignment: Assignment) -> float:
        held = tuple(assignment[n] for n, r in self.records.items()
                     if target.device in r.devices and target.family in reads(r))  # fmt: skip
        key = (id(target), held)
        if key not in self.memo:
            try:
                self.memo[key] = target.predict(self.tune(assignment))
            except (SpecError, ValueError, ZeroDivisionError) as err:
                self.memo[key] = math.nan
                self.errors[id(target)] = str(err)
        return self.memo[key]


def _score(errors: list[float], bound: float | None) -> tuple[int, float]:
    """(bound violated, rms log error): least squares in log, a bound first."""
    if any(not math.isfinite(e) or e <= -1 for e in errors):
        return 2, math.inf
    logs = [math.log1p(e) for e in errors]
    rms = math.sqrt(sum(x * x for x in logs) / len(logs))
    violated = bound is not None and max(abs(e) for e in errors) > bound
    return int(violated), rms


def fit(record: Fitted, targets: list[Target], assignment: Assignment,
        preds: Predictions) -> tuple[float, ...]:  # fmt: skip
    """The record's values that minimise its objective over ``targets`` (the other records
    at ``assignment``): coordinate descent over its axes' grids from the grid points
    nearest its priors; its priors where there are no targets."""
    if not targets:
        return record.priors

    def score(point: tuple[float, ...]) -> tuple[int, float]:
        trial = {**assignment, record.name: point}
        return _score([preds(t, trial) / t.measured - 1 for t in targets],
                      record.fit.bound_worst)  # fmt: skip

    point = tuple(min(a.grid, key=lambda g, p=a.prior: abs(g - p)) for a in record.axes)
    best = score(point)
    for _ in range(10):
        moved = False
        for i, axis in enumerate(record.axes):
            for g in axis.grid:
                trial = (*point[:i], g, *point[i + 1 :])
                s = score(trial)
                if s < best:
                    best, point, moved = s, trial, True
        if not moved:
            break
    return point


def _overlaps(changed: Fitted, record: Fitted) -> bool:
    """Whether ``changed``'s new values can move ``record``'s fit: a device both hold,
    read by the estimates ``record`` is fitted on."""
    family = "serving" if record.fit.quantity == "serving" else "training"
    return bool(set(changed.devices) & set(record.devices)) and family in reads(changed)


def fold(records: dict[str, Fitted], targets: list[Target], left_out: str | None,
         preds: Predictions) -> Assignment:  # fmt: skip
    """The records' values refitted, in order, on their fit runs less ``left_out``'s (None:
    on all of them). A record keeps its catalog value where neither its fit runs nor an
    earlier record's value on a device it shares changed."""
    assignment = {name: r.values for name, r in records.items()}
    changed: list[Fitted] = []
    for name, record in records.items():
        own = [t for t in targets if selects(record, t)]
        if left_out is not None:
            touched = any(t.source == left_out for t in own)
            if not touched and not any(_overlaps(c, record) for c in changed):
                continue
        values = fit(record, [t for t in own if t.source != left_out], assignment, preds)
        if values != record.values:
            changed.append(record)
        assignment[name] = values
    return assignment


def summary(errors: list[float]) -> dict[str, float]:
    """n, median, p90 and worst |error|, bias (median signed error), and the most negative
    (too slow) and most positive (too fast) errors."""
    mags = sorted(abs(e) for e in errors)
    return {"n": len(mags), "median": statistics.median(mags),
            "p90": mags[min(len(mags) - 1, round(0.9 * (len(mags) - 1)))],
            "worst": mags[-1], "bias": statistics.median(errors), "low": min(errors),
            "high": max(errors)}  # fmt: skip


@dataclass
class Result:
    """Per target: in-sample and leave-one-source-out predictions; per source, the values
    its fold refitted; per record, the fit on every run."""

    rows: list[dict[str, Any]]
    folds: dict[str, Assignment]
    refit: Assignment


class Journal(Protocol):
    """Where finished folds are kept (``validate.published.loso_journal``)."""

    def done(self, source: str | None) -> tuple[Assignment, list[dict[str, Any]]] | None: ...

    def add(self, source: str | None, assignment: Assignment,
            rows: list[dict[str, Any]]) -> None: ...  # fmt: skip


def run(records: dict[str, Fitted], targets: list[Target],
        progress: Callable[[str], None] = lambda line: None,
        journal: Journal | None = None) -> Result:  # fmt: skip
    """Every source's fold, and each target's prediction in-sample (the catalog's values)
    and by its source's fold; a ``journal`` keeps each fold as it finishes and hands back
    those an interrupted run finished."""
    preds = Predictions(records)
    catalog = {name: r.values for name, r in records.items()}
    kept = journal.done(None) if journal else None
    refit = kept[0] if kept else fold(records, targets, None, preds)
    if journal and not kept:
        journal.add(None, refit, [])
    sources = sorted({t.source for t in targets})
    folds, rows = {}, []
    for i, source in enumerate(sources, 1):
        kept = journal.done(source) if journal else None
        if kept:
            folds[source], mine = kept
            rows += mine
            progress(f"[{i}/{len(sources)}] {source}: kept (--resume)")
            continue
        folds[source] = fold(records, targets, source, preds)
        mine = [_row(t, preds(t, catalog), preds(t, folds[source]), records,
                     preds.errors.get(id(t)))
                for t in targets if t.source == source]  # fmt: skip
        rows += mine
        if journal:
            journal.add(source, folds[source], mine)
        moved = {n: v for n, v in folds[source].items() if v != catalog[n]}
        progress(
            f"[{i}/{len(sources)}] {source}: {len(mine)} targets; refitted without it: "
            + (", ".join(f"{n} {_values(v)}" for n, v in moved.items()) or "nothing")
        )
    return Result(rows, folds, refit)


def _row(t: Target, inside: float, outside: float, records: dict[str, Fitted],
         error: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {"source": t.source, "run": t.run, "quantity": t.quantity, "category": t.category,
            "device": t.device, "measured": t.measured, "in_sample": inside, "loso": outside,
            "in_sample_err": inside / t.measured - 1, "loso_err": outside / t.measured - 1,
            "moe": bool(t.traits["moe"]),
            "fitted_on": [n for n, r in records.items() if selects(r, t)],
            **({"error": error} if error else {})}  # fmt: skip


def _values(values: tuple[float, ...]) -> str:
    return "/".join(f"{v:.4g}" for v in values)


def figures(result: Result, records: dict[str, Fitted]) -> dict[str, dict[str, Any]]:
    """Per record, over its fit runs: in-sample and leave-one-source-out summaries, the
    sources, the refit on every run and each fold's values where its fit runs are
    touched."""
    out = {}
    for name, _record in records.items():
        rows = [r for r in result.rows if name in r["fitted_on"] and _finite(r)]
        sources = sorted({r["source"] for r in rows})
        out[name] = {
            "runs": len(rows),
            "sources": sources,
            "in_sample": _rounded(summary([r["in_sample_err"] for r in rows])) if rows else {},
            "loso": _rounded(summary([r["loso_err"] for r in rows])) if rows else {},
            "refit": list(result.refit[name]),
            "folds": {s: list(result.folds[s][name]) for s in sources},
            **_moe_part(rows),
        }
    return out


def _moe_part(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The mixture-of-experts runs' own figures, where a record's runs mix dense and MoE
    models (serving): a caveat quotes them."""
    moe = [r for r in rows if r.get("moe")]
    if not moe or len(moe) == len(rows):
        return {}
    return {"moe": {"runs": len(moe), "sources": len({r["source"] for r in moe}),
                    "in_sample": _rounded(summary([r["in_sample_err"] for r in moe])),
                    "loso": _rounded(summary([r["loso_err"] for r in moe]))}}  # fmt: skip


def _finite(row: dict[str, Any]) -> bool:
    return all(isinstance(row[k], float) and math.isfinite(row[k])
               for k in ("in_sample_err", "loso_err"))  # fmt: skip


def _rounded(stats: dict[str, float]) -> dict[str, float]:
    return {k: (v if k == "n" else round(v, 4)) for k, v in stats.items()}
