"""costmodel explorer (first page): pick a model and a training setup, see what it costs.

Run: ``.venv/bin/streamlit run app.py``. Every number comes from ``costmodel.estimate``.
"""

from __future__ import annotations

import altair as alt
import streamlit as st
import sympy as sp

from costmodel import PRESETS, TrainSpec, estimate, get_model
from costmodel import specs as S
from costmodel.units import GIB, fmt_bytes, fmt_count

st.set_page_config(page_title="costmodel", layout="wide")
st.title("What will training this transformer cost?")

with st.sidebar:
    st.header("Model")
    name = st.selectbox("preset", list(PRESETS), index=list(PRESETS).index("cs336-2.7b"))
    st.header("Training")
    batch = st.number_input("batch (sequences)", min_value=1, value=4, step=1)
    seq = st.number_input("sequence length", min_value=1, value=1024, step=128)
    precision = st.selectbox("precision", S.PRECISIONS, index=S.PRECISIONS.index("bf16-mixed"))
    optimizer = st.selectbox("optimizer", S.OPTIMIZERS)
    attention = st.selectbox("attention kernel", S.ATTENTION_KERNELS, index=1)
    recompute = st.selectbox("recomputation", S.RECOMPUTE_POLICIES)
    grad_accum = st.number_input("gradient accumulation steps", min_value=1, value=1, step=1)

try:
    model = get_model(name)
    train = TrainSpec(
        batch=int(batch),
        seq=int(seq),
        precision=precision,
        optimizer=optimizer,
        attention=attention,
        recompute=recompute,
        grad_accum=int(grad_accum),
    )
    est = estimate(model, train)
except ValueError as err:
    st.error(f"Invalid input: {err}")
    st.stop()

v = est.values
cols = st.columns(4)
cols[0].metric("parameters", fmt_count(v["params.total"]).split(" (")[-1].rstrip(")"))
cols[1].metric("FLOPs per step", f"{v['flops.step']:.3e}")
cols[2].metric("peak memory (GiB)", f"{v['memory_bytes.peak'] / GIB:,.2f}")
cols[3].metric("activations (GiB)", f"{v['memory_bytes.activations'] / GIB:,.2f}")

memory = [
    {"component": k.split(".")[-1], "GiB": v[k] / GIB}
    for k in (
        "memory_bytes.params",
        "memory_bytes.master",
        "memory_bytes.grads",
        "memory_bytes.optimizer",
        "memory_bytes.activations",
    )
]
st.subheader("Memory per device")
st.altair_chart(
    alt.Chart(alt.Data(values=memory))
    .mark_bar()
    .encode(x=alt.X("GiB:Q"), y=alt.Y("component:N", sort=None), tooltip=["component:N", "GiB:Q"]),
    use_container_width=True,
)
st.table(
    {
        "quantity": [k for k in v if k.startswith("memory_bytes.")],
        "value": [fmt_bytes(v[k]) for k in v if k.startswith("memory_bytes.")],
    }
)
st.subheader("Formula")
st.latex(r"\text{activations} = " + sp.latex(est.expr("memory_bytes.activations")))
