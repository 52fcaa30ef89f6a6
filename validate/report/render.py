"""``report.md`` and ``report.html`` from a results directory.

``python -m validate.report.render DIR`` (``validate.run`` writes both at the end of every run,
interrupted ones included). The summary gives, per suite, quantity and device, the median
and maximum absolute relative error of the ``ok`` rows; the targets section checks them
against the goals; the HTML adds Altair charts: predicted vs measured per quantity,
relative error per case, and the per-component time breakdown.
"""

from __future__ import annotations

import argparse
import html
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import altair as alt

from validate.report.attention import attention_chart, attention_table
from validate.report.dist import ddp_table, dist_charts, parallel_table
from validate.report.results import read_rows

TIME_QUANTITIES = ("time_s.forward", "time_s.backward", "time_s.step")
MEMORY_QUANTITIES = (
    "memory_bytes.peak_forward",
    "memory_bytes.peak_forward_backward",
    "memory_bytes.peak",
)
ATTENTION_MEMORY = ("memory_bytes.after_forward", "memory_bytes.peak")
TARGETS = (  # (label, suite, quantities, bound on the median |rel_err|)
    ("exact counts: zero error", "accounting", None, 0.0),
    ("forward/backward/step time: median |error| <= 15 %", "model", TIME_QUANTITIES, 0.15),
    ("peak memory: median |error| <= 10 %", "model", MEMORY_QUANTITIES, 0.10),
    ("attention memory: median |error| <= 10 %", "attention", ATTENTION_MEMORY, 0.10),
    (
        "FSDP/TP communication bytes: zero error",
        "parallel",
        ("comm_bytes.fsdp", "comm_bytes.tp"),
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
    """Each target with the median |rel_err| it is about (None where nothing was measured)."""
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
        out.append({"target": label, "n": len(errs), "value": value, "met": met})
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


def _num(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:.4g}"


def _table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def _targets_table(rows: list[dict[str, Any]]) -> str:
    met = {True: "yes", False: "**no**"}
    lines = [[t["target"], str(t["n"]), _pct(t["value"]), met.get(t["met"], "not measured")]
             for t in targets(rows)]  # fmt: skip
    return _table(["target", "rows", "value", "met"], lines)


def _summary_table(rows: list[dict[str, Any]]) -> str:
    lines = [[s["suite"], s["quantity"], s["device"], str(s["n"]),
              _pct(s["median_abs_rel_err"]), _pct(s["max_abs_rel_err"])]
             for s in summary(rows)]  # fmt: skip
    return _table(["suite", "quantity", "device", "n", "median", "max"], lines)


def _rows_table(rows: list[dict[str, Any]]) -> str:
    lines = [[r["suite"], r["case"], r["quantity"], _num(r["predicted"]), _num(r["measured"]),
              _pct(r.get("rel_err")), r.get("unit", "")]
             for r in rows if r["status"] == "ok"]  # fmt: skip
    return _table(["suite", "case", "quantity", "predicted", "measured", "error", "unit"], lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    devices = sorted({r["device"] for r in rows})
    parts = [f"# validate.run report\n\n{len(rows)} rows; devices: {', '.join(devices)}\n",
             "## Targets\n", _targets_table(rows),
             "\n## Summary (|predicted - measured| / measured)\n", _summary_table(rows),
             attention_table(rows), ddp_table(rows), parallel_table(rows)]  # fmt: skip
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        lines = [[r["suite"], r["case"], r["status"], str(r.get("message", ""))] for r in failed]
        parts += ["\n## Not measured (OOM, errors, skipped)\n",
                  _table(["suite", "case", "status", "message"], lines)]  # fmt: skip
    parts += ["\n## All rows\n", _rows_table(rows)]
    return "\n".join(parts) + "\n"


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


def html_page(rows: list[dict[str, Any]]) -> str:
    specs = [c.to_json(indent=None) for c in charts(rows)]
    body = [f'<div id="c{i}"></div>' for i in range(len(specs))]
    embeds = "\n".join(f'vegaEmbed("#c{i}", {s});' for i, s in enumerate(specs))
    md = html.escape(markdown(rows))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>validate.run report</title>
<script src="https://cdn.jsdelivr.net/npm/vega@5"></script>
<script src="https://cdn.jsdelivr.net/npm/vega-lite@5"></script>
<script src="https://cdn.jsdelivr.net/npm/vega-embed@6"></script></head>
<body style="font-family: sans-serif">{"".join(body)}
<pre>{md}</pre>
<script>{embeds}</script></body></html>
"""


def write_report(out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    rows = read_rows(out)
    (out / "report.md").write_text(markdown(rows))
    (out / "report.html").write_text(html_page(rows))
    return out / "report.md", out / "report.html"


def main() -> None:
    parser = argparse.ArgumentParser(description="Write report.md and report.html")
    parser.add_argument("out", help="a validate.run --out directory")
    md, page = write_report(parser.parse_args().out)
    print(f"wrote {md} and {page}")


if __name__ == "__main__":
    main()
