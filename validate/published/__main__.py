"""``python -m validate.published [--runs FILE] [--out DIR] [--resume]``: predict every
published run, write one JSON line per (run, quantity) as it is computed (``--resume``: keep
the runs an interrupted run finished, ``validate.published.journal``), then ``report.md`` and
``report.html`` (per-source error table, targets, worst runs, predicted vs measured plot).
Prints the per-source table. Torch-free; takes a few seconds.

``python -m validate.published --loso [--out DIR] [--resume] [--record]``: every fitted
parameter of ``costmodel/catalog/data/fitted.json`` refitted without each source of every
corpus file (training and serving), that source predicted by the refit
(:mod:`validate.published.loso`); prints in-sample beside leave-one-source-out error and
writes ``loso.md`` and ``loso.jsonl`` (one line per finished fold; ``--resume`` keeps them).
``--record`` writes the figures into the records. Training takes seconds, serving minutes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from validate.published.compare import rows_for, summarize
from validate.published.corpus import CorpusError, corpus_parser, open_corpus, run_label
from validate.published.journal import Journal
from validate.published.report import html_page, markdown
from validate.report.render import _pct


def main(argv: list[str] | None = None) -> int:
    parser = corpus_parser("python -m validate.published", __doc__)
    parser.add_argument("--resume", action="store_true", help="keep what --out finished")
    parser.add_argument(
        "--loso",
        action="store_true",
        help="leave-one-source-out over every corpus file (not --runs)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="with --loso: write the figures into costmodel's fitted.json",
    )
    args = parser.parse_args(argv)
    if args.loso or args.record:
        if args.runs or not args.loso:
            print("error: --loso takes every corpus file (not --runs); --record needs --loso",
                  file=sys.stderr)  # fmt: skip
            return 2
        from validate.published.loso_main import main as loso_main

        return loso_main(Path(args.out), args.resume, args.record)
    try:
        runs, out = open_corpus(args)
        journal = Journal(out, args.resume)
    except (CorpusError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = []
    for i, run in enumerate(runs, 1):
        rid = run_label(run)[0]
        new = journal.done(rid, run)
        if new is None:
            new = journal.add(rid, run, rows_for(run))
            errs = " ".join(_pct(r["rel_err"]) if r["status"] == "ok"
                            else f"not predicted ({r['error']})" for r in new)  # fmt: skip
        else:
            errs = "kept (--resume)"
        rows += new
        print(f"[{i}/{len(runs)}] {rid}: {errs}", file=sys.stderr)
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
    if not any(r["status"] == "ok" for r in rows):  # nothing to report is not a report
        print(f"error: none of the {len(runs)} runs could be predicted (each one's reason "
              "is on its line above)", file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
