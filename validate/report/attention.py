"""The attention benchmark in the report: a table and time / memory vs sequence length."""

from __future__ import annotations

from typing import Any

import altair as alt

from validate.report.tables import Table

QUANTITIES = (
    "time_s.forward",
    "time_s.backward",
    "memory_bytes.after_forward",
    "memory_bytes.peak",
)


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r
        for r in rows
        if r["suite"] == "attention" and r.get("config") and r["quantity"] in QUANTITIES
    ]


def attention_table(rows: list[dict[str, Any]]) -> Table | None:
    """One line per (kernel, dtype, seq, d), measured (predicted) per quantity."""
    cells: dict[tuple, dict[str, str]] = {}
    for r in _rows(rows):
        c = r["config"]
        key = (c["kernel"], c["dtype"], c["seq"], c["head_dim"])
        scale, unit = (1e3, "ms") if r["quantity"].startswith("time") else (2**-20, "MiB")
        if r["status"] != "ok":
            text = r["status"].upper()
        else:
            text = f"{r['measured'] * scale:.3g} ({r['predicted'] * scale:.3g})"
        cells.setdefault(key, {})[r["quantity"]] = f"{text} {unit}"
    if not cells:
        return None
    header = ["kernel", "dtype", "seq", "d", "forward", "backward", "after forward", "peak"]
    lines = [[*map(str, key), *(cells[key].get(q, "–") for q in QUANTITIES)]
             for key in sorted(cells)]  # fmt: skip
    return Table("Attention kernels: measured (predicted)", header, lines)


def attention_chart(rows: list[dict[str, Any]]) -> alt.Chart | None:
    """Measured (points) and predicted (lines) vs sequence length, per kernel and quantity."""
    data = []
    for r in _rows(rows):
        if r["status"] != "ok":
            continue
        c = r["config"]
        series = f"{c['kernel']} {c['dtype']} d={c['head_dim']}"
        for source in ("measured", "predicted"):
            data.append({"seq": c["seq"], "quantity": r["quantity"], "series": series,
                         "source": source, "value": r[source]})  # fmt: skip
    if not data:
        return None
    base = alt.Chart(alt.Data(values=data)).encode(
        alt.X("seq:Q", scale=alt.Scale(type="log", base=2)),
        alt.Y("value:Q", scale=alt.Scale(type="log")),
        alt.Color("series:N"),
        tooltip=["series:N", "seq:Q", "source:N", "value:Q"],
    )
    measured = base.transform_filter(alt.datum.source == "measured").mark_point(filled=True)
    predicted = base.transform_filter(alt.datum.source == "predicted").mark_line(strokeDash=[4, 2])
    return (
        alt.layer(measured, predicted)
        .facet(
            facet=alt.Facet("quantity:N"),
            columns=2,
            title="Attention: measured (points) and predicted (dashed) vs sequence length",
        )
        .resolve_scale(y="independent")
    )
