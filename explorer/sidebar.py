"""The sidebar: one widget per input of ``explorer.state.FIELDS``, in four sections.

Widget keys are the inputs' keys, so session state, the URL and ``costmodel.inputs.build``
speak one vocabulary. Each section gets a message slot, where an error about one of its
inputs is shown next to the widgets.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from costmodel import ModelSpec
from costmodel.catalog.hf import model_from_hf_dict, parse_config
from costmodel.inputs import BY_KEY
from explorer.state import FIELDS, MODEL_OVERRIDES, START, choices, from_query, to_query

_LABELS = {
    "batch": "batch (sequences per step)",
    "seq": "sequence length",
    "optimizer_impl": "optimizer implementation",
    "attention": "attention",
    "attention_kernel": "flash kernel (auto: the device's default)",
    "recompute": "recomputation",
    "finetune": "fine-tuning (full: every weight trains)",
    "lora_rank": "LoRA rank r",
    "lora_targets": "matrices with adapters",
    "grad_accum": "gradient accumulation steps (empty: from the micro-batch)",
    "microbatch": "micro-batch per device (empty: 1, or from grad_accum)",
    "hardware": "device",
    "gpus": "GPUs (empty: what the degrees need)",
    "zero": "ZeRO stage",
    "sequence_parallel": "sequence parallel (with tp)",
    "elementwise": "elementwise kernels (fused: compiled; eager: PyTorch)",
    "framework": "framework (what each rank holds)",
    "pp_interleave": "virtual stages per pipeline rank",
    "grad_reduce_fp32": "reduce gradients in fp32",
    "overlap": "overlap of communication",
    "token_budget": "token budget",
    "price_per_hour": "$ per device-hour",
}


def init_state() -> None:
    """Session state from the URL on first load (bad parameters become warnings)."""
    if st.session_state.get("_initialised"):
        return
    values, problems = from_query(st.query_params.to_dict())
    for key, value in values.items():
        if value is not None:  # unset inputs stay unset: the widget shows a placeholder
            st.session_state[key] = value
    # each problem with the value its widget shows on the first run (recorded then)
    st.session_state["_problems"] = {k: (m, _UNSEEN) for k, m in problems.items()}
    st.session_state["_initialised"] = True


_UNSEEN = object()


def url_problems() -> list[str]:
    """The URL's bad parameters whose inputs the user has not changed since the first run
    (call after the sidebar: a widget's first value is what it showed then)."""
    problems = st.session_state.get("_problems", {})
    for key, (message, first) in list(problems.items()):
        now = st.session_state.get(key)
        if first is _UNSEEN:
            problems[key] = (message, now)
        elif key in START and now != first:
            del problems[key]
    return [message for message, _ in problems.values()]


def _tri_state(value: bool | None) -> str:
    return {None: "framework's default", True: "yes", False: "no"}[value]


def _widget(key: str, container: Any = st) -> None:
    field, label = BY_KEY[key], _LABELS.get(key, key)
    options = choices(key)
    if field.kind is bool and field.default is None:  # unset: the framework's own value
        container.selectbox(label, (None, True, False), key=key, format_func=_tri_state)
    elif field.kind is bool:
        container.checkbox(label, key=key)
    elif options and key in ("overlap",):
        container.radio(label, options, key=key, horizontal=True)
    elif options:
        container.selectbox(label, options, key=key)
    elif field.kind is float:
        container.number_input(label, min_value=0.0, format="%.4g", key=key)
    else:
        unset = {} if key in st.session_state else {"value": None}
        container.number_input(label, min_value=1, step=1, key=key,
                               placeholder="preset's value" if key in MODEL_OVERRIDES else "",
                               **unset)  # fmt: skip


def sidebar() -> tuple[dict[str, Any], ModelSpec | str | None, dict[str, Any]]:
    """The inputs' values, an uploaded model (None: none; a string: why it was refused),
    and a message slot per section."""
    st.header("Model")
    upload = st.file_uploader("Hugging Face config.json (optional)", type=["json"])
    st.selectbox("preset", choices("model"), key="model", disabled=upload is not None)
    with st.expander("override fields"):
        for key in MODEL_OVERRIDES:
            _widget(key)
    slots = {"model": st.empty()}
    st.header("Training")
    for key in ("batch", "seq", "precision", "optimizer", "optimizer_impl", "attention",
                "attention_kernel", "elementwise"):  # fmt: skip
        _widget(key)
    _widget("recompute")
    _widget("grad_accum")
    _widget("microbatch")
    _widget("finetune")
    if st.session_state.get("finetune", "full") != "full":
        _widget("lora_rank")
        _widget("lora_targets")
    slots["training"] = st.empty()
    st.header("Cluster and layout")
    for key in ("hardware", "gpus", "framework", "fsdp", "zero", "tp", "pp", "pp_interleave",
                "cp", "ep", "ep_imbalance", "capacity_factor", "ep_overlap",
                "sequence_parallel", "grad_reduce_fp32"):  # fmt: skip
        _widget(key)
    _widget("overlap")
    st.caption("dp fills the devices the other degrees leave.")
    slots["cluster"] = st.empty()
    st.header("Budget")
    _widget("token_budget")
    _widget("price_per_hour")
    slots["cost"] = st.empty()
    values = {f.key: st.session_state.get(f.key, START[f.key]) for f in FIELDS}
    for key in ("token_budget", "price_per_hour"):  # 0 in the widget asks nothing
        values[key] = values[key] or None
    uploaded: ModelSpec | str | None = None
    if upload is not None:
        try:
            uploaded = model_from_hf_dict(parse_config(upload.getvalue(), upload.name), upload.name)
        except ValueError as err:  # the page shows it as bad input, not the preset's result
            uploaded = f"{upload.name}: {err}"
    st.query_params.from_dict(to_query(values))
    return values, uploaded, slots
