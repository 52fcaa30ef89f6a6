"""costmodel explorer: pick a model, a batch, a cluster and a layout; see what it costs.

Run: ``./scripts/setup.sh && .venv/bin/python -m explorer`` (``streamlit run app.py`` with
the pages imported before the server listens: ``explorer/__main__.py``). Every number comes from
``costmodel``; the inputs are mirrored in the URL, so a link reproduces the view. The
Plan page searches every layout of a cluster for the fastest that fits
(``costmodel.engine.plan``); Offload plans training larger than device memory
(``costmodel.engine.offload``); Padding compares padding, bucketing and packing
(``costmodel.engine.padding``); Serve estimates serving a model (``costmodel.serving``);
the last plots ``validate.run`` results when a results
folder exists.
"""

from __future__ import annotations

import streamlit as st

from explorer.pages import estimate_page
from explorer.plan_page import plan_page
from explorer.results import results_page
from explorer.serving import serve_page
from explorer.workloads import offload_page, padding_page

st.set_page_config(page_title="costmodel", layout="wide")
page = st.navigation(
    [
        st.Page(estimate_page, title="Estimate", default=True),
        st.Page(plan_page, title="Plan", url_path="plan"),
        st.Page(offload_page, title="Offload", url_path="offload"),
        st.Page(padding_page, title="Padding", url_path="padding"),
        st.Page(serve_page, title="Serve", url_path="serve"),
        st.Page(results_page, title="Validation results", url_path="results"),
    ]
)
page.run()
