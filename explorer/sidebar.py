"""The sidebar: one widget per input of ``explorer.state.FIELDS``, in four sections.

Widget keys are the inputs' keys, so session state, the URL and ``costmodel.inputs.build``
speak one vocabulary. Each widget has a plain label and its input's help
(``explorer.labels``) and a message slot directly under it, where an error about that
input is shown. An uploaded config.json replaces the preset box with the model's name and
travels in the URL (``explorer.state.UPLOAD_KEY``).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from costmodel import ModelSpec
from costmodel.catalog.hf import model_from_hf_dict, parse_config
from costmodel.inputs import BY_KEY
from costmodel.specs.frameworks import trait
from explorer.labels import help_of, in_words, label
from explorer.state import (
    FIELDS,
    MODEL_OVERRIDES,
    START,
    UPLOAD_KEY,
    choices,
    decode_config,
    encode_config,
    from_query,
    to_query,
)


def init_state() -> None:
    """Session state from the URL on first load (bad parameters become warnings); later,
    the inputs as they were when another page was shown (Streamlit drops the state of
    widgets a run does not draw)."""
    if st.session_state.get("_initialised"):
        for key, value in st.session_state.get("_inputs", {}).items():
            if key not in st.session_state and value is not None:
                st.session_state[key] = value
        return
    query = st.query_params.to_dict()
    link_config = query.pop(UPLOAD_KEY, None)
    values, problems = from_query(query)
    if link_config is not None:
        try:
            st.session_state["_config"] = ("link", decode_config(link_config))
        except ValueError as err:
            problems[UPLOAD_KEY] = f"{UPLOAD_KEY}: {err}; using the preset"
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


_ZERO_UNUSED = (
    "Not used: nothing is sharded. Set the FSDP / ZeRO shard group, or pick a "
    "framework that shards by default (fsdp2, deepspeed), and the stage applies."
)


def _zero_unused() -> str | None:
    """Why the ZeRO stage does not apply (None where it does): nothing is sharded (no
    shard group, and the framework does not shard by default), or the framework runs its
    own stage (``explorer.state._given`` passes the stage only where it applies)."""
    framework = st.session_state.get("framework") or BY_KEY["framework"].default
    if not trait(framework, "zero_stages"):
        return in_words(f"Not used: {framework} shards as {trait(framework, 'sharding')}.")
    sharded = st.session_state.get("fsdp") is not None or trait(framework, "shards_by_default")
    return None if sharded else _ZERO_UNUSED


def _widget(key: str, slots: dict[str, Any], container: Any = st) -> None:
    """The input's widget, then its message slot directly under it."""
    field, text, help_ = BY_KEY[key], label(key), help_of(key)
    options = choices(key)
    if field.kind is bool and field.default is None:  # unset: the framework's own value
        container.selectbox(text, (None, True, False), key=key, format_func=_tri_state,
                            help=help_)  # fmt: skip
    elif field.kind is bool:
        container.checkbox(text, key=key, help=help_)
    elif options and key in ("overlap",):
        container.radio(text, options, key=key, horizontal=True, help=help_)
    elif options:
        # Where the stage does not apply the box is greyed and its label says why; its
        # options stay the stages as they read (the browser keeps a choice by its text: a
        # greyed "not used" came back as the first stage, 1, once the box was live again)
        unused = _zero_unused() if key == "zero" else None
        container.selectbox(f"{text} ({unused})" if unused else text, options, key=key,
                            disabled=bool(unused), help=help_)  # fmt: skip
    elif field.kind is float:
        container.number_input(text, min_value=0.0, format="%.4g", key=key, help=help_)
    else:
        unset = {} if key in st.session_state else {"value": None}
        hint = {
            "fsdp": "framework's default",
            "etp": "tp",
            **dict.fromkeys(MODEL_OVERRIDES, "preset's value"),
        }
        container.number_input(text, min_value=1, step=1, key=key, help=help_,
                               placeholder=hint.get(key, ""), **unset)  # fmt: skip
    slots[key] = container.empty()


TRAINING_KEYS = ("batch", "seq", "precision", "optimizer", "optimizer_impl", "attention",
                 "attention_kernel", "elementwise", "recompute", "grad_accum", "microbatch",
                 "finetune")  # fmt: skip
CLUSTER_KEYS = ("hardware", "gpus", "framework", "fsdp", "zero", "tp", "pp", "pp_interleave",
                "pp_schedule", "cp", "ep", "etp", "ep_dispatcher", "ep_imbalance",
                "capacity_factor", "ep_overlap", "sequence_parallel", "grad_reduce_fp32",
                "overlap")  # fmt: skip


def sidebar() -> tuple[dict[str, Any], ModelSpec | str | None, dict[str, Any]]:
    """The inputs' values, an uploaded model (None: none; a string: why it was refused),
    and a message slot per widget."""
    slots: dict[str, Any] = {}
    st.header("Model")
    config = _model_section(slots)
    overridden = any(st.session_state.get(k) is not None for k in MODEL_OVERRIDES)
    with st.expander("override fields", expanded=overridden):
        for key in MODEL_OVERRIDES:
            _widget(key, slots)
    st.header("Training")
    for key in TRAINING_KEYS:
        _widget(key, slots)
        if key == "precision" and st.session_state.get("precision") == "fp8":
            _widget("fp8_recipe", slots)  # how fp8 scales its GEMMs: fp8 only
    if st.session_state.get("finetune", "full") != "full":
        _widget("lora_rank", slots)
        _widget("lora_targets", slots)
    st.header("Cluster and layout")
    for key in CLUSTER_KEYS:
        _widget(key, slots)
    st.caption("Data parallelism (dp) fills the devices the other degrees leave.")
    st.header("Budget")
    _widget("token_budget", slots)
    _widget("price_per_hour", slots)
    values = {f.key: st.session_state.get(f.key, START[f.key]) for f in FIELDS}
    st.session_state["_inputs"] = dict(values)
    for key in ("token_budget", "price_per_hour"):  # 0 in the widget asks nothing
        values[key] = values[key] or None
    uploaded = _uploaded(config)
    query = to_query(values)
    if config is not None:  # the model is the upload, not the preset's box
        query.pop("model", None)
        query[UPLOAD_KEY] = encode_config(config[1])
    st.query_params.from_dict(query)
    return values, uploaded, slots


def _model_section(slots: dict[str, Any]) -> tuple[str, bytes] | None:
    """The preset box, or the uploaded (or linked) config.json's name in its place;
    returns (file name, bytes) of the config in use. An upload is kept until it is
    removed (not when another page was shown, which empties the uploader)."""
    upload = st.file_uploader("Hugging Face config.json (optional)", type=["json"],
                              key="upload", on_change=_on_upload,
                              help="a model's config.json replaces the preset")  # fmt: skip
    config = st.session_state.get("_config")
    if config is None:
        _widget("model", slots)
        return None
    model = _uploaded(config)
    name = model.name if isinstance(model, ModelSpec) else "not read"
    st.markdown(f"**model: {name}** (from {'the link' if config[0] == 'link' else config[0]})")
    if upload is None:
        st.button("use a preset instead", on_click=st.session_state.__setitem__,
                  args=("_config", None))  # fmt: skip
    slots["model"] = st.empty()
    return config


def _on_upload() -> None:
    """A file put in the uploader is the model; removing it goes back to the preset."""
    upload = st.session_state.get("upload")
    st.session_state["_config"] = None if upload is None else (upload.name, upload.getvalue())


def _uploaded(config: tuple[str, bytes] | None) -> ModelSpec | str | None:
    """The model a config.json describes, or why it was refused (a string)."""
    if config is None:
        return None
    source = "config.json" if config[0] == "link" else config[0]
    try:
        return model_from_hf_dict(parse_config(config[1], source), source)
    except ValueError as err:  # the page shows it as bad input, not the preset's result
        said = str(err)  # the reader's messages name the file; the spec checks' do not
        return said if said.startswith(f"{source}: ") else f"{source}: {said}"
