"""``python -m validate.published [--runs FILE] [--out DIR] [--resume]``: predict every
published run, write one JSON line per (run, quantity) as it is computed (``--resume``: keep
the runs an interrupted run finished, ``validate.published.journal``), then ``report.md`` and
``report.html`` (per-source error table, targets, worst runs, predicted vs measured plot).
Prints the per-source table. Torch-free; takes a few seconds.
"""

from __future__ import annotations

import sys

from validate.published.compare import rows_for, summarize
from validate.published.corpus import CorpusError, corpus_parser, open_corpus, run_label
from validate.published.journal import Journal
from validate.published.report import html_page, markdown
from validate.report.render import _pct


def main(argv: list[str] | None = None) -> int:
    parser = corpus_parser("python -m validate.published", __doc__)
    parser.add_argument("--resume", action="store_true", help="keep the runs --out finished")
    args = parser.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
