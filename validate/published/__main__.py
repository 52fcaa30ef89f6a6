"""``python -m validate.published [--runs FILE] [--out DIR]``: predict every published run,
write one JSON line per (run, quantity) as it is computed, then ``report.md`` and
``report.html`` (per-source error table, targets, worst runs, predicted vs measured plot).
Prints the per-source table. Torch-free; takes a few seconds.
"""

from __future__ import annotations

import json
import sys

from validate.published.compare import rows_for, summarize
from validate.published.corpus import CorpusError, corpus_parser, open_corpus, run_label
from validate.published.report import html_page, markdown
from validate.report.render import _pct


def main(argv: list[str] | None = None) -> int:
    args = corpus_parser("python -m validate.published", __doc__).parse_args(argv)
    try:
        runs, out = open_corpus(args)
    except CorpusError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = []
    with (out / "rows.jsonl").open("w") as f:
        for i, run in enumerate(runs, 1):
            new = rows_for(run)
            for row in new:
                f.write(json.dumps(row, allow_nan=False) + "\n")
            f.flush()
            rows += new
            errs = " ".join(_pct(r["rel_err"]) if r["status"] == "ok"
                            else f"not predicted ({r['error']})" for r in new)  # fmt: skip
            print(f"[{i}/{len(runs)}] {run_label(run)[0]}: {errs}", file=sys.stderr)
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
