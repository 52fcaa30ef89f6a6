"""``report.md`` and ``report.html`` for the published-runs comparison.

Per source and quantity: n, median and p90 |error|, bias (median signed error) and the
worst run; the targets of issue 12 (median |error| <= 8 % for tokens/s and for memory per
GPU, no run worse than 30 %); the worst runs with their layout, assumptions and predicted
breakdown, as tables (``validate.report.tables``). The HTML, self-contained (static SVG,
no script), adds predicted vs measured (log axes, y = x and a ±10 % band) per
quantity. Torch-free.
"""

from __future__ import annotations

from typing import Any

import altair as alt

from validate.published.compare import summarize
from validate.report.render import _num, _pct, chart_svg
from validate.report.tables import STYLE, Table

TARGET_MEDIAN, TARGET_WORST = 0.08, 0.30
WORST_SHOWN = 10


def targets(rows: list[dict[str, Any]]) -> list[list[str]]:
    lines = []
    for s in summarize(rows):
        if not s["overall"]:
            continue
        ok = s["median_abs"] <= TARGET_MEDIAN and s["worst_abs"] <= TARGET_WORST
        lines.append([s["quantity"], str(s["n"]), _pct(s["median_abs"]), _pct(s["worst_abs"]),
                      "yes" if ok else "**no**"])  # fmt: skip
    return lines


def tables(rows: list[dict[str, Any]]) -> list[Table]:
    """Targets, per source, runs not predicted, the worst rows and every row: the tables
    report.md and report.html both show, in this order."""
    summary = [[s["quantity"], s["group"], str(s["n"]), _pct(s["median_abs"]),
                _pct(s["p90_abs"]), _pct(s["bias"]), _pct(s["worst_abs"])]
               for s in summarize(rows)]  # fmt: skip
    errors = [[r["case"], str(r["error"])] for r in rows if r["status"] != "ok"]
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -abs(r["rel_err"]))
    aim = f"median |error| <= {TARGET_MEDIAN:.0%}, every run within {TARGET_WORST:.0%}"
    return [
        Table(f"Targets ({aim})", ["quantity", "runs", "median |error|", "worst |error|", "met"],
              targets(rows)),
        Table("Per source", ["quantity", "source", "n", "median |err|", "p90 |err|", "bias",
                             "worst"], summary),
        Table(f"Runs not predicted ({len(errors)})", ["run", "why"], errors),
        Table(f"Worst {WORST_SHOWN} rows", ["run", "quantity", "predicted", "measured", "error",
                                            "layout", "breakdown", "assumptions"],
              [_worst(r) for r in ok[:WORST_SHOWN]]),
        Table("Every row", ["run", "quantity", "layout", "predicted", "measured", "error"],
              _lines(ok)),
    ]  # fmt: skip


def markdown(rows: list[dict[str, Any]]) -> str:
    """report.md: every table of :func:`tables`."""
    return "# Published runs: predicted vs measured\n" + "".join(t.markdown() for t in tables(rows))


def _lines(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[r["case"], r["quantity"], r["layout"], _num(r["predicted"]), _num(r["measured"]),
             _pct(r["rel_err"])] for r in rows]  # fmt: skip


def _worst(row: dict[str, Any]) -> list[str]:
    parts = ", ".join(f"{k} {_num(v)}" for k, v in row["breakdown"].items())
    layout = f"{row['layout']} on {row['n_gpus']} x {row['device']}"
    notes = "; ".join(row["assumptions"]) or "none"
    return [row["case"], row["quantity"], _num(row["predicted"]), _num(row["measured"]),
            _pct(row["rel_err"]), layout, parts, notes]  # fmt: skip


def chart(rows: list[dict[str, Any]]) -> alt.Chart:
    """Predicted vs measured per quantity, log axes, y = x and a ±10 % band."""
    ok = [{k: r[k] for k in ("case", "group", "quantity", "predicted", "measured", "rel_err")}
          for r in rows if r["status"] == "ok"]  # fmt: skip
    return alt.hconcat(*(_one(q, ok) for q in sorted({r["quantity"] for r in ok})))


def _extent(rows: list[dict[str, Any]], pad: float) -> tuple[float, float]:
    values = [v for r in rows for v in (r["predicted"], r["measured"])] or [1.0, 10.0]
    return min(values) / pad, max(values) * pad


def _one(quantity: str, ok: list[dict[str, Any]]) -> alt.Chart:
    rows = [r for r in ok if r["quantity"] == quantity]
    lo, hi = _extent(rows, 1.3)
    line = [{"x": x, "y": x, "lo": 0.9 * x, "hi": 1.1 * x} for x in _logspace(lo, hi)]
    log = alt.Scale(type="log", domain=[lo, hi])
    band = (
        alt.Chart(alt.Data(values=line))
        .mark_area(opacity=0.15)
        .encode(alt.X("x:Q", scale=log, title="measured"), alt.Y("lo:Q", scale=log), alt.Y2("hi:Q"))
    )
    diagonal = (
        alt.Chart(alt.Data(values=line))
        .mark_line(color="black")
        .encode(alt.X("x:Q", scale=log), alt.Y("y:Q", scale=log, title="predicted"))
    )
    points = (
        alt.Chart(alt.Data(values=rows))
        .mark_point(filled=True, size=60)
        .encode(alt.X("measured:Q", scale=log), alt.Y("predicted:Q", scale=log),
                alt.Color("group:N"), tooltip=["case:N", "predicted:Q", "measured:Q",
                                               alt.Tooltip("rel_err:Q", format="+.1%")])
    )  # fmt: skip
    title = f"{quantity}: predicted vs measured (y = x, ±10 % band)"
    return alt.layer(band, diagonal, points, title=title).properties(width=360, height=360)


def _logspace(lo: float, hi: float, n: int = 60) -> list[float]:
    ratio = (hi / lo) ** (1 / (n - 1))
    return [lo * ratio**i for i in range(n)]


def html_page(rows: list[dict[str, Any]]) -> str:
    """report.html, self-contained: the chart as static SVG and the tables of report.md."""
    body = "\n".join(t.html() for t in tables(rows))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>costmodel vs published runs</title>
<style>
{STYLE}
</style></head>
<body>
<h1>Published runs: predicted vs measured</h1>
<div class="chart">{chart_svg(chart(rows))}</div>
{body}
</body></html>
"""
