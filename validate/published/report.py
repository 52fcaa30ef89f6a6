"""``report.md`` and ``report.html`` for the published-runs comparison.

Per source and quantity: n, median and p90 |error|, bias (median signed error) and the
worst run; the targets of issue 12 (median |error| <= 8 % for tokens/s and for memory per
GPU, no run worse than 30 %); the worst runs with their layout, assumptions and predicted
breakdown. The HTML adds predicted vs measured (log axes, y = x and a ±10 % band) per
quantity. Torch-free.
"""

from __future__ import annotations

import html
from typing import Any

import altair as alt

from validate.published.compare import summarize
from validate.report.render import _num, _pct, _table

TARGET_MEDIAN, TARGET_WORST = 0.08, 0.30
WORST_SHOWN = 10


def targets(rows: list[dict[str, Any]]) -> list[list[str]]:
    lines = []
    for s in summarize(rows):
        if s["group"] != "all":
            continue
        ok = s["median_abs"] <= TARGET_MEDIAN and s["worst_abs"] <= TARGET_WORST
        lines.append([s["quantity"], str(s["n"]), _pct(s["median_abs"]), _pct(s["worst_abs"]),
                      "yes" if ok else "**no**"])  # fmt: skip
    return lines


def markdown(rows: list[dict[str, Any]]) -> str:
    summary = [[s["quantity"], s["group"], str(s["n"]), _pct(s["median_abs"]),
                _pct(s["p90_abs"]), _pct(s["bias"]), _pct(s["worst_abs"])]
               for s in summarize(rows)]  # fmt: skip
    errors = [r for r in rows if r["status"] != "ok"]
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -abs(r["rel_err"]))
    parts = [
        "# Published runs: predicted vs measured",
        "",
        f"## Targets (median |error| <= {TARGET_MEDIAN:.0%}, every run within {TARGET_WORST:.0%})",
        _table(["quantity", "runs", "median |error|", "worst |error|", "met"], targets(rows)),
        "",
        "## Per source",
        _table(["quantity", "source", "n", "median |err|", "p90 |err|", "bias", "worst"], summary),
        "",
        f"## Runs not predicted ({len(errors)})",
        *(f"- {r['case']}: {r['error']}" for r in errors),
        "",
        f"## Worst {WORST_SHOWN} rows",
        *(_worst(r) for r in ok[:WORST_SHOWN]),
        "",
        "## Every row",
        _table(["run", "quantity", "layout", "predicted", "measured", "error"], _lines(ok)),
    ]
    return "\n".join(parts) + "\n"


def _lines(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[r["case"], r["quantity"], r["layout"], _num(r["predicted"]), _num(r["measured"]),
             _pct(r["rel_err"])] for r in rows]  # fmt: skip


def _worst(row: dict[str, Any]) -> str:
    parts = ", ".join(f"{k} {_num(v)}" for k, v in row["breakdown"].items())
    notes = "; ".join(row["assumptions"]) or "none"
    return (
        f"- **{row['case']}** ({row['quantity']}): predicted {_num(row['predicted'])}, "
        f"measured {_num(row['measured'])} ({_pct(row['rel_err'])}); {row['layout']} on "
        f"{row['n_gpus']} x {row['device']}.\n  Breakdown: {parts}.\n  Assumptions: {notes}."
    )


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
    spec = chart(rows).to_json(indent=None)
    md = html.escape(markdown(rows))
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>costmodel vs published runs</title>
<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>
<script src="https://cdn.jsdelivr.net/npm/vega-lite@5"></script>
<script src="https://cdn.jsdelivr.net/npm/vega-embed@6"></script></head>
<body style="font-family: sans-serif"><div id="chart"></div><pre>{md}</pre>
<script>vegaEmbed("#chart", {spec});</script></body></html>
"""
