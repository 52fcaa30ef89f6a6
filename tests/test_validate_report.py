"""report.html is self-contained (inline SVG charts, HTML tables, no script), holds the same
tables as report.md, and survives a chart that cannot be drawn; readers skip bad rows."""

from __future__ import annotations

import json
import re

import altair as alt

from validate.report import render
from validate.report.results import ResultsLog, Row, load_rows, read_rows
from validate.report.tables import Table


def _rows() -> list[dict]:
    return [
        Row("model", "a", "time_s.forward", 1.3, 1.0, "cpu", "ok", "s").to_dict(),
        Row("model", "a", "op_time_s.forward.ffn", 0.5, 0.4, "cpu", "ok", "s").to_dict(),
        Row("accounting", "a", "params.total", 7, 7, "cpu", "ok").to_dict(),
        Row(
            "model", "d", "oom", None, None, "cpu", "oom", extra={"message": "<b>a|b</b>"}
        ).to_dict(),
    ]


def test_html_report_is_self_contained_with_tables_and_svg():
    page = render.html_page(_rows())
    assert "<script" not in page
    assert not [u for u in re.findall(r"https?://[^\s\"'<>]+", page) if "www.w3.org" not in u]
    assert page.count("<svg") == 3  # scatter, errors per case, time per component
    assert page.count("<table>") == 4  # targets, summary, not measured, all rows
    headings = re.findall(r"<h2>(.*?)</h2>\s*<table>", page)
    assert headings[0] == "Targets"
    assert page.index("<h2>Targets</h2>") < page.index("<table>") < page.index("<h2>Summary")
    assert "&lt;b&gt;a|b&lt;/b&gt;" in page and "<b>a" not in page  # cell text escaped
    assert '<td class="num">30.00 %</td>' in page and "<td>model</td>" in page
    assert "<td><strong>no</strong></td>" in page  # the missed time target


def test_markdown_and_html_come_from_the_same_tables():
    rows = _rows()
    head, rest = render.tables(rows)
    md, page = render.markdown(rows), render.html_page(rows)
    assert [t.title for t in head] == ["Targets", "Summary (|predicted - measured| / measured)"]
    for table in head + rest:
        assert table.markdown() in md and table.html() in page
    assert md.index("## Targets") < md.index("## Summary") < md.index("## All rows")
    assert "| model | d | oom | <b>a\\|b</b> |" in md  # a pipe cannot break the table


def test_a_chart_that_fails_to_convert_is_named_in_its_place(monkeypatch):
    def fail_on_errors(spec: dict) -> str:
        if spec.get("title") == "Relative error per case":
            raise ValueError("no font")
        return "<svg></svg>"

    monkeypatch.setattr(render.vl_convert, "vegalite_to_svg", fail_on_errors)
    page = render.html_page(_rows())
    assert page.count("<svg") == 2
    assert 'Chart "Relative error per case" could not be drawn: ValueError: no font' in page


def test_chart_svg_draws_a_real_chart():
    chart = alt.Chart(alt.Data(values=[{"x": 1, "y": 2}])).mark_point().encode(x="x:Q", y="y:Q")
    assert render.chart_svg(chart).startswith("<svg")


def test_table_alignment_marks_numbers_only():
    html = Table("t", ["a", "b"], [["gpt2/b1", "1,234"], ["–", "-0.5 ms"]]).html()
    assert "<td>gpt2/b1</td>" in html and '<td class="num">1,234</td>' in html
    assert '<td class="num">–</td>' in html and '<td class="num">-0.5 ms</td>' in html


def test_readers_skip_and_count_rows_they_cannot_use(tmp_path):
    good = Row("model", "c", "time_s.forward", 1.1, 1.0, "cpu").to_dict()
    bad = [
        {k: v for k, v in good.items() if k != "status"},
        {**good, "status": "weird"},
        {**good, "measured": "fast"},
        [1, 2],
    ]
    text = "\n".join(map(json.dumps, [good, *bad])) + '\n{"suite": "model", "ca'
    (tmp_path / "results.jsonl").write_text(text)
    assert load_rows(tmp_path) == ([good], 5)
    assert read_rows(tmp_path) == [good]
    log = ResultsLog(tmp_path / "fresh")
    assert load_rows(log.dir) == ([], 0)
    render.write_report(tmp_path)  # the report of a folder with bad lines still renders
    assert "1 rows" in (tmp_path / "report.md").read_text()


def test_published_runs_report_is_self_contained_too():
    """validate.published's report.html: the chart as SVG, the same tables as report.md."""
    from validate.published import report
    from validate.published.compare import rows_for
    from validate.published.corpus import load_runs

    rows = [r for run in load_runs()[:6] for r in rows_for(run)]
    page, md = report.html_page(rows), report.markdown(rows)
    assert "<script" not in page and page.count("<svg") == 1
    titles = [t.title for t in report.tables(rows)]
    assert re.findall(r"<h2>(.*?)</h2>", page) == [
        t.replace("<", "&lt;").replace(">", "&gt;") for t in titles
    ]
    assert all(f"## {t}" in md for t in titles)
    assert titles[0].startswith("Targets")
