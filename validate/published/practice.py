"""Check against practice: where the layout each published run's authors chose ranks in
costmodel's plan for the same model, cluster, batch and sequence.

``python -m validate.published.practice [--runs FILE] [--out DIR] [--fresh]``: for every run
that maps to specs, the planner searches the run's framework (FSDP2 or Megatron) over
every layout of its GPU count, with the run's precision, kernels and optimizer, all four
recompute policies and the planner's default memory budget (peak allocated bytes at most
90 % of HBM). The authors' layout is predicted with ``estimate`` exactly as
``validate.published`` predicts it. One JSON line per run is written as it finishes
(``practice.jsonl``; a rerun resumes after the runs already there), then ``practice.md``.
Torch-free; the first run compiles each new structure (minutes), later ones read the disk
cache.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from costmodel import estimate
from costmodel.engine.plan import TIE, PlanOptions, layout_label, plan
from validate.published.corpus import (
    Case,
    CorpusError,
    case_of,
    corpus_parser,
    open_corpus,
    run_label,
)

RECOMPUTE = ("none", "selective", "selective-op", "full")


def authors_layout(case: Case) -> str:
    p, t = case.parallel, case.train
    return layout_label({
        "framework": p.framework, "zero": p.zero, "dp": p.dp, "fsdp": p.fsdp, "tp": p.tp,
        "sequence_parallel": p.sequence_parallel, "pp": p.pp, "pp_interleave": p.pp_interleave,
        "cp": p.cp, "micro_batch": t.micro_batch // p.batch_step(1), "grad_accum": t.grad_accum,
        "recompute": t.recompute,
    })  # fmt: skip


def practice_row(case: Case) -> dict[str, Any]:
    """The authors' layout against the plan: its rank among the layouts predicted to fit,
    the predicted best, and the gap between them."""
    options = PlanOptions(frameworks=(case.parallel.framework,), recompute=RECOMPUTE)
    p = plan(case.model, case.train, case.hardware, case.n_gpus, options)
    own = estimate(case.model, case.train, case.parallel, case.hardware)
    step, peak = float(own["time_s.step"]), float(own["memory_bytes_per_device.peak"])
    steps = p.values["time_s.step"][p.order]
    row: dict[str, Any] = {
        "case": case.id, "group": case.group, "n_gpus": case.n_gpus,
        "hardware": case.hardware.name, "authors": authors_layout(case),
        "authors_step_s": step, "authors_fit": peak <= p.budget_bytes,
        "authors_peak_gib": peak / 2**30, "fitting": len(p.order), "valid": p.valid,
    }  # fmt: skip
    if not len(p.order):
        return {**row, "status": "no layout fits"}
    best = p.row(int(p.order[0]))
    faster = int(np.sum(steps < step * (1 - TIE)))
    return {
        **row,
        "status": "ok",
        "rank": faster + 1,
        "percentile": faster / len(steps),
        "best": layout_label(best),
        "best_step_s": best["time_s.step"],
        "gap": step / best["time_s.step"] - 1,
        "best_limit": best["limit"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    ok = [r for r in rows if r.get("status") == "ok"]
    lines = ["# Published layouts in costmodel's plan", ""]
    if ok:
        gaps = sorted(r["gap"] for r in ok)
        near = sum(g <= 0.05 for g in gaps)
        lines += [
            f"{len(ok)} runs ranked. The authors' layout is predicted within 5 % of the best "
            f"for {near} ({near / len(ok):.0%}); median gap {statistics.median(gaps):+.1%}, "
            f"median rank percentile {statistics.median(r['percentile'] for r in ok):.1%}.",
            "",
            "gap = predicted step of the authors' layout / predicted step of the plan's best - 1;"
            " rank among the layouts predicted to fit (peak at most 90 % of HBM; ties within 0.5 %"
            " share a rank).",
            "",
            "| source | runs | within 5 % | median gap | worst gap |",
            "|---|---:|---:|---:|---:|",
            *_by_source(ok),
            "",
            "| run | GPUs | authors' layout | rank | of | gap | plan's best | best limited by |",
            "|---|---:|---|---:|---:|---:|---|---|",
        ]
        for r in sorted(ok, key=lambda r: r["gap"]):
            fit = "" if r["authors_fit"] else " (predicted not to fit)"
            lines.append(f"| {r['case']} | {r['n_gpus']} | {r['authors']}{fit} | {r['rank']} "
                         f"| {r['fitting']} | {r['gap']:+.1%} | {r['best']} "
                         f"| {r['best_limit']} |")  # fmt: skip
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"- {r['case']}: {r.get('status')}: {r.get('error', '')}")
    return "\n".join(lines) + "\n"


def _by_source(ok: list[dict[str, Any]]) -> list[str]:
    groups: dict[str, list[float]] = {}
    for r in ok:
        groups.setdefault(r["group"], []).append(r["gap"])
    return [
        f"| {g} | {len(v)} | {sum(x <= 0.05 for x in v)} | {statistics.median(v):+.1%} | "
        f"{max(v):+.1%} |"
        for g, v in sorted(groups.items())
    ]


def _done(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    rows = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            rows[row["case"]] = row
        except (ValueError, KeyError):
            continue  # a line cut by an interrupt: that run is redone
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = corpus_parser("python -m validate.published.practice", __doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true", help="ignore earlier results")
    args = parser.parse_args(argv)
    try:
        runs, out = open_corpus(args)
    except CorpusError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    path = out / "practice.jsonl"
    done = {} if args.fresh else _done(path)
    with path.open("w" if args.fresh else "a") as f:
        if f.tell() and not path.read_bytes().endswith(b"\n"):
            f.write("\n")  # after a line an interrupt cut short
        for i, run in enumerate(runs, 1):
            rid, group = run_label(run)
            if rid in done:
                continue
            try:
                row = practice_row(case_of(run))
            except (CorpusError, ValueError, KeyError) as err:
                row = {"case": rid, "group": group, "status": "error", "error": str(err)}
            f.write(json.dumps(row, allow_nan=False) + "\n")
            f.flush()
            done[rid] = row
            gap = f"rank {row['rank']}/{row['fitting']}, gap {row['gap']:+.1%}" if (
                row["status"] == "ok") else row["status"]  # fmt: skip
            print(f"[{i}/{len(runs)}] {rid}: {gap}", file=sys.stderr)
    rows = [done[rid] for rid in (run_label(r)[0] for r in runs) if rid in done]
    text = markdown(rows)
    (out / "practice.md").write_text(text)
    print(text.split("\n| run")[0].strip())
    print(f"wrote {path}, {out / 'practice.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
