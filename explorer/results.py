"""The Validation results page: plots a ``validate.run`` results folder (torch-free)."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import streamlit as st


def results_page() -> None:
    st.title("Predicted vs measured (validate.run)")
    if "results_dir" not in st.session_state:
        st.session_state["results_dir"] = "validate-results"
    folder = st.text_input("results folder", key="results_dir")
    path = Path(folder) / "results.jsonl"
    if not path.exists():
        st.info(f"No {path} yet: run `python -m validate.run --quick --out {folder}`.")
        return
    from validate.report.render import summary
    from validate.report.results import read_rows

    rows = read_rows(folder)
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
