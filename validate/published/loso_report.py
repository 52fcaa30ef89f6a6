"""Tables of a leave-one-source-out run: in-sample beside leave-one-source-out error, by
category, by source and by fitted parameter (``loso.md``; the same rows are printed).
Torch-free."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from costmodel.catalog.fitted import Fitted
from validate.published.loso import Result, summary
from validate.report.tables import Table

HEADLINE = ("dense training (GPU)", "dense training (TPU)", "dense training",
            "MoE training (GPU)", "MoE training (TPU)", "MoE training",
            "memory", "serving", "serving (throughput)", "serving (TTFT)", "serving (TPOT)",
            "serving (end to end)")  # fmt: skip
"""The categories the headline reports, in this order (a bare "dense training" or "MoE
training" pools GPUs and TPUs)."""


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _pair(rows: list[dict[str, Any]]) -> list[str]:
    """n, then median / p90 / worst |error| in-sample and leave-one-source-out."""
    inside = summary([r["in_sample_err"] for r in rows])
    outside = summary([r["loso_err"] for r in rows])
    cells = [str(inside["n"])]
    for stats in (inside, outside):
        cells.append(" / ".join(_pct(stats[k]) for k in ("median", "p90", "worst")))
    return cells


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows both predictions gave a number for (a journal keeps a failed one as null)."""
    return [r for r in rows if all(isinstance(r[k], float) and math.isfinite(r[k])
                                   for k in ("in_sample_err", "loso_err"))]  # fmt: skip


def by_category(result: Result) -> dict[str, list[dict[str, Any]]]:
    """The headline's groups of rows (:data:`HEADLINE`)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in _ok(result.rows):
        groups[r["category"]].append(r)
        if r["category"].endswith(")"):
            groups[r["category"].rsplit(" (", 1)[0]].append(r)
    return {k: groups[k] for k in HEADLINE if groups.get(k)}


def tables(result: Result, records: dict[str, Fitted], skipped: list[str]) -> list[Table]:
    """Headline, per source, per fitted parameter, and the runs not predicted."""
    head = ["n", "in-sample median / p90 / worst", "leave-one-source-out median / p90 / worst"]
    cats = [[k, *_pair(rows)] for k, rows in by_category(result).items()]
    sources: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in _ok(result.rows):
        sources[(r["source"], r["category"])].append(r)
    per_source = [[s, c, *_pair(rows), _moved(result, records, s)]
                  for (s, c), rows in sorted(sources.items())]  # fmt: skip
    params = [_param_line(name, rec, result) for name, rec in records.items()]
    failed = {f"{r['run']}: {r.get('error', 'no prediction')}" for r in result.rows
              if r not in _ok([r])}  # fmt: skip
    lost = [*skipped, *sorted(failed)]
    return [
        Table("Leave-one-source-out: headline", ["category", *head], cats,
              "A source is one publisher's document; each source is predicted by every fitted "
              "parameter refitted without it (python -m validate.published --loso)."),
        Table("Per source", ["source", "category", *head, "refitted without it"], per_source),
        Table("Per fitted parameter (its fit runs)",
              ["parameter", "catalog", "refit on all", "sources", *head,
               "value without each source"],
              params),
        Table(f"Runs not predicted ({len(lost)})", ["why"], [[s] for s in lost]),
    ]  # fmt: skip


def _values(values: Any) -> str:
    return "/".join(f"{v:.4g}" for v in values)


def _moved(result: Result, records: dict[str, Fitted], source: str) -> str:
    fold = result.folds[source]
    moved = [f"{n} {_values(v)}" for n, v in fold.items() if tuple(v) != records[n].values]
    return ", ".join(moved) or "nothing"


def _param_line(name: str, record: Fitted, result: Result) -> list[str]:
    rows = [r for r in _ok(result.rows) if name in r["fitted_on"]]
    sources = sorted({r["source"] for r in rows})
    pair = _pair(rows) if rows else ["0", "–", "–"]
    folds = "; ".join(f"{s}: {_values(result.folds[s][name])}" for s in sources)
    return [name, _values(record.values), _values(result.refit[name]), str(len(sources)), *pair,
            folds or "–"]  # fmt: skip


def markdown(result: Result, records: dict[str, Fitted], skipped: list[str]) -> str:
    return "# Published runs: leave-one-source-out\n" + "".join(
        t.markdown() for t in tables(result, records, skipped)
    )


def text(result: Result, records: dict[str, Fitted]) -> str:
    """The headline and per-parameter lines as plain text (what the command prints)."""
    lines = [f"{'category':24} {'n':>4}  {'in-sample med/p90/worst':>28}  "
             f"{'leave-one-source-out med/p90/worst':>36}"]  # fmt: skip
    for k, rows in by_category(result).items():
        n, inside, outside = _pair(rows)
        lines.append(f"{k:24} {n:>4}  {inside:>28}  {outside:>36}")
    lines.append("")
    for name, record in records.items():
        line = _param_line(name, record, result)
        lines.append(f"{name}: catalog {line[1]}, refit {line[2]}, {line[4]} runs of {line[3]} "
                     f"sources: in-sample {line[5]}, leave-one-source-out {line[6]}")  # fmt: skip
    return "\n".join(lines)
