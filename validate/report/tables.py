"""The report's tables as data, written as markdown (``report.md``) or HTML (``report.html``).

Both files are rendered from the same :class:`Table` (heading, header, cell text, note), so
they cannot disagree. Cells are plain text; a whole cell in ``**bold**`` is the one markup
(a missed target), kept as is in markdown and made ``<strong>`` in HTML.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

_BOLD = re.compile(r"\*\*(.+)\*\*")
_NUMERIC = re.compile(r"[-+]?\d|–$")  # a number (with unit or percent) or the "–" of none

STYLE = """body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.chart-error { color: #a00; border: 1px dashed #a00; padding: 0.5em; }"""


@dataclass(frozen=True)
class Table:
    title: str
    header: list[str]
    lines: list[list[str]]
    note: str = ""

    def markdown(self) -> str:
        """``## title``, the pipe table, and the note."""
        cells = [self.header, ["---"] * len(self.header), *self.lines]
        table = "\n".join("| " + " | ".join(map(_md_cell, line)) + " |" for line in cells)
        note = f"\n{self.note}\n" if self.note else ""
        return f"\n## {self.title}\n\n{table}\n{note}"

    def html(self) -> str:
        """``<h2>``, a ``<table>`` (escaped text, numbers right-aligned) and the note."""
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "\n".join("<tr>" + "".join(map(_html_cell, line)) + "</tr>" for line in self.lines)
        note = f"<p>{html.escape(self.note)}</p>" if self.note else ""
        return (
            f"<h2>{html.escape(self.title)}</h2>\n<table>\n<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody>\n</table>\n{note}"
        )


def _md_cell(text: str) -> str:
    """A cell that cannot break the pipe table (``|`` escaped, one line)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _html_cell(text: str) -> str:
    bold = _BOLD.fullmatch(text)
    inner = f"<strong>{html.escape(bold[1])}</strong>" if bold else html.escape(text)
    numeric = ' class="num"' if _NUMERIC.match(text) else ""
    return f"<td{numeric}>{inner}</td>"
