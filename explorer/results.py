"""The Validation results page: plots a ``validate.run`` results folder (torch-free).

The folder box reads only folders under the working directory: the app may be served to
others, and a path typed there must not read the server's other files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import altair as alt
import streamlit as st

HELP = (
    "A validate.run --out folder under the working directory the app was started in; "
    "folders outside it (absolute paths, .. or symlinks leading out) are not read."
)


def folder_under(text: str, root: Path) -> Path | None:
    """The folder ``text`` names (relative to ``root``), resolved through ``..`` and
    symlinks, if it lies under ``root``; None if it leads anywhere else."""
    base = root.resolve()
    try:
        path = (base / text.strip()).resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
        return None
    return path if path.is_relative_to(base) else None


def _unreadable(results: Path, root: Path) -> str:
    """Why ``results`` is not read (empty: it is): a link leading out of ``root``, or not a
    regular file (a FIFO would block the page's read forever)."""
    try:
        target = results.resolve()
    except (OSError, RuntimeError):
        return "a link that cannot be resolved"
    if not target.is_relative_to(root.resolve()):
        return "a link to a file outside the working directory"
    return "" if target.is_file() else "not a regular file"


def _rows(folder: str) -> list[dict[str, Any]] | None:
    """The usable rows of the folder typed, or None after saying why there are none."""
    path = folder_under(folder, Path.cwd())
    if path is None:
        st.error(
            f"Only folders under the working directory ({Path.cwd()}) are read: "
            f"{folder!r} is outside it."
        )
        return None
    results = path / "results.jsonl"
    try:  # a name past the file system's limit raises instead of answering False
        missing = not results.exists() and not results.is_symlink()
    except OSError as err:
        st.error(f"The results folder cannot be read: {err.strerror or err}.")
        return None
    if missing:
        st.info(
            f"No {folder}/results.jsonl yet: run `python -m validate.run --quick --out {folder}`."
        )
        return None
    why = _unreadable(results, Path.cwd())
    if why:
        st.error(f"{folder}/results.jsonl is not read: {why}.")
        return None
    from validate.report.results import load_rows

    rows, skipped = load_rows(path)
    if skipped:
        st.warning(f"{skipped} lines skipped (unreadable or missing fields)")
    return rows


def results_page() -> None:
    st.title("Predicted vs measured (validate.run)")
    if "results_dir" not in st.session_state:
        st.session_state["results_dir"] = "validate-results"
    folder = st.text_input("results folder", key="results_dir", help=HELP)
    rows = _rows(folder)
    if rows is None:
        return
    from validate.report.render import summary

    ok = [r for r in rows if r["status"] == "ok" and r["predicted"] and r["measured"]]
    st.metric(
        "rows",
        len(rows),
        f"{len(rows) - len(ok)} not compared",
        delta_color="off",
        delta_arrow="off",
    )
    quantities = sorted({r["quantity"] for r in ok})
    chosen = st.multiselect(
        "quantities", quantities, default=[q for q in quantities if q.startswith("time_s")][:4]
    )
    data = [
        {k: r[k] for k in ("case", "quantity", "predicted", "measured", "rel_err")}
        for r in ok
        if r["quantity"] in chosen
    ]
    log = alt.Scale(type="log")
    st.altair_chart(
        alt.Chart(alt.Data(values=data), title="predicted vs measured")
        .mark_point()
        .encode(
            alt.X("measured:Q", scale=log),
            alt.Y("predicted:Q", scale=log),
            alt.Color("quantity:N"),
            tooltip=["case:N", "quantity:N", "rel_err:Q"],
        ),
        width="stretch",
    )
    st.dataframe(summary(rows), hide_index=True)
