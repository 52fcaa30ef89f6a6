"""The distributed suites in the report: DDP variants and the bucket sweep, collective
bandwidth against the α-β fit, FSDP/TP byte counts."""

from __future__ import annotations

from typing import Any

import altair as alt

from validate.report.tables import Table


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{1e3 * x:.2f}"


def ddp_table(rows: list[dict[str, Any]]) -> Table | None:
    """Per DDP variant: step, communication wait, its share, the α-β time, overlap achieved."""
    ddp = [r for r in rows if r["suite"] == "ddp" and r["status"] == "ok"]
    if not ddp:
        return None
    steps = {r["case"]: r["measured"] for r in ddp if r["quantity"] == "time_s.step"}
    comm = {r["case"]: r for r in ddp if r["quantity"].startswith("comm_time_s")}
    blocking = {k: comm[k]["measured"] for k in ("naive", "flat") if k in comm}
    lines = []
    for case in sorted(comm):
        r = comm[case]
        base = blocking.get("naive" if case == "overlap" else "flat")
        overlap = "–"
        if r["quantity"].endswith("exposed") and base:
            overlap = f"{100 * max(0.0, 1 - r['measured'] / base):.0f} %"
        lines.append([case, _ms(steps.get(case)), _ms(r["measured"]),
                      f"{100 * r['comm_share']:.0f} %", _ms(r["predicted_total_comm_s"]),
                      overlap])  # fmt: skip
    header = ["variant", "step (ms)", "waiting for comm (ms)", "comm share", "α-β comm (ms)",
              "overlap achieved"]  # fmt: skip
    note = (
        "overlap achieved: the share of the blocking variant's communication wait "
        "(naive for overlap, flat for bucketed) that backward hid."
    )
    return Table("DDP variants (2 ranks)", header, lines, note)


def parallel_table(rows: list[dict[str, Any]]) -> Table | None:
    """FSDP/TP rows: bytes per rank and the time inside collectives, with the calls counted."""
    par = [r for r in rows if r["suite"] == "parallel" and r["status"] == "ok"
           and r["quantity"].startswith("comm_")]  # fmt: skip
    if not par:
        return None
    lines = []
    for r in par:
        calls = ", ".join(f"{k} x{v}" for k, v in r.get("calls", {}).items()) or "–"
        case = r["case"] + (f" rank {r['rank']}" if "rank" in r else "")
        lines.append([case, r["quantity"], f"{r['predicted']:.6g}", f"{r['measured']:.6g}", calls])
    header = ["case", "quantity", "predicted", "measured", "collectives"]
    return Table("FSDP and TP communication", header, lines)


def _layout_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["suite"] == "parallel" and r["status"] == "ok"
            and r["quantity"].startswith("memory_bytes_per_device.") and "rank" in r]  # fmt: skip


def layout_table(rows: list[dict[str, Any]]) -> Table | None:
    """Per layout and quantity: costmodel's per-device bytes against each rank's."""
    mem = _layout_rows(rows)
    if not mem:
        return None
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in mem:
        by_key.setdefault((r["case"], r["quantity"]), []).append(r)
    lines = []
    for (case, quantity), rs in by_key.items():
        rs = sorted(rs, key=lambda r: r["rank"])
        worst = max(abs(r["rel_err"]) for r in rs if r.get("rel_err") is not None)
        measured = " / ".join(f"{r['measured'] / 2**20:.3f}" for r in rs)
        predicted = [f"{r['predicted'] / 2**20:.3f}" for r in rs]
        one = len(set(predicted)) == 1  # a pipeline's ranks each have their own prediction
        lines.append([case, quantity.split(".", 1)[1],
                      predicted[0] if one else " / ".join(predicted),
                      measured, f"{100 * worst:.1f} %"])  # fmt: skip
    header = ["layout", "quantity", "predicted (MiB)", "measured per rank (MiB)", "worst error"]
    note = ("Bytes one rank holds (validate.distributed.memory): state after backward, what the "
            "forward pass added, and the peaks of the first step's forward and forward + "
            "backward and of the second whole step. Pipelines (validate.distributed.pipeline): "
            "each rank against its own prediction; buffers are the schedule's receive "
            "buffers, kept across steps.")  # fmt: skip
    return Table("Per-rank memory by layout", header, lines, note)


def _layout_chart(mem: list[dict[str, Any]]) -> alt.Chart:
    data = [{"layout": r["case"], "quantity": r["quantity"].split(".", 1)[1],
             "error %": 100 * r["rel_err"], "rank": r["rank"]}
            for r in mem if r.get("rel_err") is not None]  # fmt: skip
    return (
        alt.Chart(alt.Data(values=data), title="Per-rank memory: predicted vs measured (error %)")
        .mark_point(filled=True)
        .encode(alt.X("error %:Q"), alt.Y("quantity:N"), alt.Color("layout:N"),
                tooltip=["layout:N", "quantity:N", "rank:Q", "error %:Q"])
    )  # fmt: skip


def _collectives_chart(coll: list[dict[str, Any]]) -> alt.Chart:
    data = [
        {"op": r["config"]["op"], "world": r["config"]["world"],
         "MiB": r["config"]["size_bytes"] / 2**20, "source": source,
         "busbw GB/s": r["busbw"] * r["measured"] / r[source] / 1e9}
        for r in coll for source in ("measured", "predicted")
    ]  # fmt: skip
    base = alt.Chart(alt.Data(values=data)).encode(
        alt.X("MiB:Q", scale=alt.Scale(type="log", base=2)), alt.Y("busbw GB/s:Q"),
        alt.Color("op:N"), tooltip=["op:N", "world:Q", "MiB:Q", "source:N", "busbw GB/s:Q"],
    )  # fmt: skip
    points = base.transform_filter(alt.datum.source == "measured").mark_point(filled=True)
    lines = base.transform_filter(alt.datum.source == "predicted").mark_line(strokeDash=[4, 2])
    title = "Collectives: bus bandwidth, measured (points) and α-β fit (dashed)"
    return alt.layer(points, lines, title=title)


def _bucket_chart(sweep: list[dict[str, Any]]) -> alt.Chart:
    data = [{"bucket MB": r["config"]["bucket_mb"], "quantity": r["quantity"],
             "ms": 1e3 * r["measured"]} for r in sweep]  # fmt: skip
    data += [{"bucket MB": r["config"]["bucket_mb"], "quantity": "α-β comm (predicted)",
              "ms": 1e3 * r["predicted_total_comm_s"]}
             for r in sweep if "predicted_total_comm_s" in r]  # fmt: skip
    return (
        alt.Chart(alt.Data(values=data), title="Bucket size sweep (BucketedDDP, 2 ranks)")
        .mark_line(point=True)
        .encode(alt.X("bucket MB:Q", scale=alt.Scale(type="log")), alt.Y("ms:Q"),
                alt.Color("quantity:N"), tooltip=["bucket MB:Q", "quantity:N", "ms:Q"])
    )  # fmt: skip


def dist_charts(rows: list[dict[str, Any]]) -> list[alt.Chart]:
    """Collective bandwidth against the fit, the DDP bucket-size sweep, per-rank memory."""
    ok = [r for r in rows if r["status"] == "ok"]
    coll = [r for r in ok if r["suite"] == "collectives"]
    sweep = [r for r in ok if r["suite"] == "ddp" and r["case"].startswith("bucketed/")]
    mem = _layout_rows(rows)
    return (([_collectives_chart(coll)] if coll else []) + ([_bucket_chart(sweep)] if sweep else [])
            + ([_layout_chart(mem)] if mem else []))  # fmt: skip
