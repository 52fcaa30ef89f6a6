"""``python -m validate.published [--runs FILE] [--out DIR]``: predict every published run,
write one JSON line per (run, quantity) as it is computed, then ``report.md`` and
``report.html`` (per-source error table, targets, worst runs, predicted vs measured plot).
Prints the per-source table. Torch-free; takes a few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from validate.published.compare import rows_for, summarize
from validate.published.corpus import CorpusError, load_runs
from validate.published.report import html_page, markdown
from validate.report.render import _pct


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validate.published", description=__doc__)
    parser.add_argument("--runs", help="corpus JSON (default: the packaged copy of "
                        "shared/published-runs/runs.json)")  # fmt: skip
    parser.add_argument("--out", default="published-results", help="output folder")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.runs)
    except CorpusError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (out / "rows.jsonl").open("w") as f:
        for i, run in enumerate(runs, 1):
            new = rows_for(run)
            for row in new:
                f.write(json.dumps(row, allow_nan=False) + "\n")
            f.flush()
            rows += new
            errs = " ".join(_pct(r["rel_err"]) if r["status"] == "ok" else "error" for r in new)
            print(f"[{i}/{len(runs)}] {run.get('id', '?')}: {errs}", file=sys.stderr)
    (out / "report.md").write_text(markdown(rows))
    (out / "report.html").write_text(html_page(rows))
    head = ("quantity", "source", "n", "median", "p90", "bias", "worst")
    print("{:22} {:18} {:>3} {:>9} {:>9} {:>9} {:>9}".format(*head))
    for s in summarize(rows):
        cells = [_pct(s[k]) for k in ("median_abs", "p90_abs", "bias", "worst_abs")]
        print(
            "{:22} {:18} {:3d} {:>9} {:>9} {:>9} {:>9}".format(
                s["quantity"], s["group"], s["n"], *cells
            )
        )
    print(f"wrote {out / 'rows.jsonl'}, {out / 'report.md'}, {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
