"""``report.md`` and ``report.html`` from a results directory.

``python -m validate.report.render DIR`` (``validate.run`` writes both at the end of every run,
interrupted ones included). The summary gives, per suite, quantity and device, the median
and maximum absolute relative error of the ``ok`` rows; the targets section checks them
against the goals. Both files hold the same tables (``validate.report.tables``), targets
first; the HTML, self-contained (no script, nothing from the network), adds Altair charts
drawn as static SVG by vl-convert: predicted vs measured per quantity, relative error per
case, the per-component time breakdown, attention scaling and the distributed suites.
"""

from __future__ import annotations

import argparse
import html
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import altair as alt
import vl_convert

from validate.report.attention import attention_chart, attention_table
from validate.report.dist import ddp_table, dist_charts, layout_table, parallel_table
from validate.report.results import read_rows
from validate.report.tables import STYLE, Table

TIME_QUANTITIES = ("time_s.forward", "time_s.backward", "time_s.step")
MEMORY_QUANTITIES = (
    "memory_bytes.peak_forward",
    "memory_bytes.peak_forward_backward",
    "memory_bytes.peak",
)
ATTENTION_MEMORY = ("memory_bytes.after_forward", "memory_bytes.peak")
RANK_PEAKS = ("peak_forward", "peak_forward_backward", "peak")
TARGETS = (  # (label, suite, quantities, bound on the median |rel_err|)
    ("exact counts: zero error", "accounting", None, 0.0),
    ("forward/backward/step time: median |error| <= 15 %", "model", TIME_QUANTITIES, 0.15),
    ("peak memory: median |error| <= 10 %", "model", MEMORY_QUANTITIES, 0.10),
    ("attention memory: median |error| <= 10 %", "attention", ATTENTION_MEMORY, 0.10),
    ("KV cache bytes: zero error", "serve", ("kv_bytes",), 0.0),
    (
        "per-rank state bytes (params, grads, optimizer) over all ranks: zero error",
        "parallel",
        tuple(f"memory_bytes_per_device.{q}.all_ranks" for q in ("params", "grads", "optimizer")),
        0.0,
    ),
    (
        "per-rank peak memory: median |error| <= 5 %",
        "parallel",
        tuple(f"memory_bytes_per_device.{q}" for q in RANK_PEAKS),
        0.05,
    ),
    (
        "FSDP/TP/CP/EP communication bytes: zero error",
        "parallel",
        ("comm_bytes.fsdp", "comm_bytes.tp", "comm_bytes.cp", "comm_bytes.ep"),
        0.0,
    ),
)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (suite, quantity, device): n, median and max |rel_err| of ok rows."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok" and r.get("rel_err") is not None:
            groups[(r["suite"], r["quantity"], r["device"])].append(abs(r["rel_err"]))
    return [
        {
            "suite": s,
            "quantity": q,
            "device": d,
            "n": len(errs),
            "median_abs_rel_err": statistics.median(errs),
            "max_abs_rel_err": max(errs),
        }
        for (s, q, d), errs in sorted(groups.items())
    ]


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target with its bound and the |rel_err| it is about: the median, or the maximum
    for exact (zero-bound) targets; None where nothing was measured."""
    out = []
    for label, suite, quantities, bound in TARGETS:
        errs = [
            abs(r["rel_err"])
            for r in rows
            if r["suite"] == suite
            and r["status"] == "ok"
            and r.get("rel_err") is not None
            and (quantities is None or r["quantity"] in quantities)
        ]
        value = (max(errs) if bound == 0 else statistics.median(errs)) if errs else None
        met = None if value is None else value <= bound
        out.append({"target": label, "n": len(errs), "value": value, "bound": bound, "met": met})
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


def _num(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.4g}"


def _targets_table(rows: list[dict[str, Any]]) -> Table:
    met = {True: "yes", False: "**no**"}
    lines = [[t["target"], str(t["n"]), _pct(t["value"]), met.get(t["met"], "not measured")]
             for t in targets(rows)]  # fmt: skip
    return Table("Targets", ["target", "rows", "value", "met"], lines)


def _summary_table(rows: list[dict[str, Any]]) -> Table:
    lines = [[s["suite"], s["quantity"], s["device"], str(s["n"]),
              _pct(s["median_abs_rel_err"]), _pct(s["max_abs_rel_err"])]
             for s in summary(rows)]  # fmt: skip
    header = ["suite", "quantity", "device", "n", "median", "max"]
    return Table("Summary (|predicted - measured| / measured)", header, lines)


def _failed_table(rows: list[dict[str, Any]]) -> Table | None:
    lines = [[r["suite"], r["case"], r["status"], str(r.get("message", ""))]
             for r in rows if r["status"] != "ok"]  # fmt: skip
    header = ["suite", "case", "status", "message"]
    return Table("Not measured (OOM, errors, skipped)", header, lines) if lines else None


def _rows_table(rows: list[dict[str, Any]]) -> Table:
    lines = [[r["suite"], r["case"], r["quantity"], _num(r["predicted"]), _num(r["measured"]),
              _pct(r.get("rel_err")), r.get("unit", "")]
             for r in rows if r["status"] == "ok"]  # fmt: skip
    header = ["suite", "case", "quantity", "predicted", "measured", "error", "unit"]
    return Table("All rows", header, lines)


def tables(rows: list[dict[str, Any]]) -> tuple[list[Table], list[Table]]:
    """The report's tables: (targets and summary, the rest); both files show them in order."""
    rest = [
        attention_table(rows),
        ddp_table(rows),
        parallel_table(rows),
        layout_table(rows),
        _failed_table(rows),
    ]
    head = [_targets_table(rows), _summary_table(rows)]
    return head, [t for t in rest if t is not None] + [_rows_table(rows)]


def _intro(rows: list[dict[str, Any]]) -> str:
    return f"{len(rows)} rows; devices: {', '.join(sorted({r['device'] for r in rows}))}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """report.md: the intro line and every table, targets first."""
    head, rest = tables(rows)
    return f"# validate.run report\n\n{_intro(rows)}\n" + "".join(t.markdown() for t in head + rest)


def _model_charts(timed: list[dict[str, Any]]) -> list[alt.Chart]:
    data, log = alt.Data(values=timed), alt.Scale(type="log")
    scatter = (
        alt.Chart(data, title="Predicted vs measured (y = x is exact)")
        .mark_point()
        .encode(alt.X("measured:Q", scale=log), alt.Y("predicted:Q", scale=log),
                alt.Color("quantity:N"), alt.Facet("unit:N", columns=3),
                tooltip=["case:N", "quantity:N", "predicted:Q", "measured:Q", "rel_err:Q"])
        .resolve_scale(x="independent", y="independent")
    )  # fmt: skip
    errors = (
        alt.Chart(data, title="Relative error per case")
        .mark_bar()
        .encode(alt.X("rel_err:Q", axis=alt.Axis(format="%")), alt.Y("case:N", sort=None),
                alt.Color("quantity:N"), alt.YOffset("quantity:N"),
                tooltip=["case:N", "quantity:N", "rel_err:Q"])
    )  # fmt: skip
    return [scatter, errors]


def _component_chart(ok: list[dict[str, Any]]) -> alt.Chart | None:
    ops = []
    for r in ok:
        if r["quantity"].startswith("op_time_s."):
            _, phase, comp = r["quantity"].split(".")
            ops += [{"case": r["case"], "phase": phase, "component": comp, "source": source,
                     "seconds": r[source]} for source in ("predicted", "measured")]  # fmt: skip
    if not ops:
        return None
    return (
        alt.Chart(alt.Data(values=ops), title="Time per component: predicted vs measured")
        .mark_bar()
        .encode(alt.X("seconds:Q", stack="zero"), alt.Y("source:N"), alt.Color("component:N"),
                alt.Row("phase:N"),
                tooltip=["case:N", "phase:N", "component:N", "source:N", "seconds:Q"])
    )  # fmt: skip


def charts(rows: list[dict[str, Any]]) -> list[alt.Chart]:
    """Predicted vs measured, relative error per case, time per component, the attention
    scaling and the distributed suites' charts."""
    keys = ("suite", "case", "quantity", "predicted", "measured", "rel_err", "unit")
    ok = [{k: r[k] for k in keys} for r in rows
          if r["status"] == "ok" and r["predicted"] and r["measured"]]  # fmt: skip
    timed = [r for r in ok if r["suite"] == "model" and not r["quantity"].startswith("op_")]
    out = _model_charts(timed) if timed else []
    extra = [_component_chart(ok), attention_chart(rows), *dist_charts(rows)]
    return out + [c for c in extra if c is not None]


def chart_svg(chart: alt.TopLevelMixin) -> str:
    """The chart as inline SVG (vl-convert: no JavaScript, readable offline), or a line in
    its place saying why it could not be drawn: one bad chart does not cost the report."""
    try:
        return vl_convert.vegalite_to_svg(chart.to_dict())
    except Exception as err:  # any conversion failure: say so where the chart would be
        title = getattr(chart, "title", None)
        name = f'"{title}"' if isinstance(title, str) else "(untitled)"
        message = f"Chart {name} could not be drawn: {type(err).__name__}: {err}"
        return f'<p class="chart-error">{html.escape(message, quote=False)}</p>'


def html_page(rows: list[dict[str, Any]]) -> str:
    """report.html, self-contained: the same tables as report.md (targets first) and the
    charts as static SVG, with no script and nothing loaded from the network."""
    head, rest = tables(rows)
    drawn = [f'<div class="chart">{chart_svg(c)}</div>' for c in charts(rows)]
    section = ["<h2>Charts</h2>", *drawn] if drawn else []
    body = "\n".join([*(t.html() for t in head), *section, *(t.html() for t in rest)])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>validate.run report</title>
<style>
{STYLE}
</style></head>
<body>
<h1>validate.run report</h1>
<p>{html.escape(_intro(rows))}</p>
{body}
</body></html>
"""


def write_report(out_dir: str | Path) -> tuple[Path, Path]:
    """``report.md`` and ``report.html`` of ``out_dir``'s usable rows; their paths."""
    out = Path(out_dir)
    rows = read_rows(out)
    (out / "report.md").write_text(markdown(rows))
    (out / "report.html").write_text(html_page(rows))
    return out / "report.md", out / "report.html"


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Write report.md and report.html", allow_abbrev=False
    )
    parser.add_argument("out", help="a validate.run --out directory")
    md, page = write_report(parser.parse_args().out)
    print(f"wrote {md} and {page}")


if __name__ == "__main__":
    main()
