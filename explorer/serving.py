"""The Serve page: a model served on a layout (``costmodel.serving``, what ``python -m
costmodel serve`` prints): memory per device split into weights, cache and workspace, TTFT,
TPOT and throughput, and the throughput-latency curve over the batch. Bad input is a
message naming the field."""

from __future__ import annotations

from typing import Any

import altair as alt
import numpy as np
import streamlit as st

from costmodel.answers.serve import ServeAnswer, answer
from costmodel.answers.serve_words import assumptions, limited_by
from costmodel.catalog.hardware import device_choices, get_hardware
from costmodel.catalog.presets import get_model
from costmodel.serving import ServeEstimate, serve
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT as DEFAULT_ENGINE
from costmodel.specs.engines import ENGINES
from costmodel.specs.serving import ARRIVALS, FP8_SCALINGS, KV_DTYPES, PRECISIONS, ServeSpec
from costmodel.units import GIB, fmt_bytes
from explorer.labels import in_words
from explorer.page_state import PageInput, finish, start, warn_unused
from explorer.state import choices

SERVE = (
    PageInput("model", str, "llama3-8b", choices("model")),
    PageInput("hardware", str, "h100-sxm", device_choices()),
    PageInput("precision", str, "bf16", PRECISIONS),
    PageInput("kv_dtype", str, "auto", ("auto", *KV_DTYPES)),
    PageInput("engine", str, DEFAULT_ENGINE, tuple(ENGINES)),
    PageInput("tp", int, 1, hi=64),
    PageInput("arrival", str, "together", ARRIVALS),
    PageInput("pp", int, 1, hi=256),
    PageInput("dp", int, 1, hi=4096),
    PageInput("ep", int, 1, hi=4096),
    PageInput("input", int, 2000),
    PageInput("output", int, 500),
    PageInput("batch", int, 32),
    PageInput("draft_tokens", int, 0, lo=0, hi=16),
    PageInput("acceptance", float, 0.8, lo=0.01, hi=1.0),
    PageInput("prefill_replicas", int, 0, lo=0, hi=4096),
    PageInput("prefill_tp", int, 1, hi=64),
    PageInput("request_rate", float, 0.0, lo=0.0, hi=1e6),
    PageInput("length_spread", float, 0.0, lo=0.0, hi=1.0),
    PageInput("batch_overlap", str, "off", ("off", "on")),
    PageInput("rope_scaling", float, 1.0, lo=1.0, hi=1024.0),
    PageInput("fp8_scaling", str, "auto", FP8_SCALINGS),
)

EP_HELP = ("a mixture-of-experts model's routed experts whole over ep devices spanning ep / tp "
           "replicas (attention data parallel)")  # fmt: skip
ARRIVAL_HELP = (
    "together: a static batch, prompts prefilled at once; continuous: an engine "
    "kept full, prompt chunks riding on the decode iterations (steady state; at a rate its "
    "mean); poisson (with a rate, the default): random arrivals simulated one by one, "
    "queueing included"
)
ENGINE_HELP = (
    "the engine and release served on: its defaults (max sequences, tokens an "
    "iteration, memory share, cache dtype) and its host time per iteration"
)
POOL_HELP = "disaggregated serving: replicas that only prefill and send the cache on to decode"
RATE_HELP = ("requests arriving per second over the replicas, at random (poisson: simulated "
             "with their queueing, TTFT and TPOT percentiles) or as a steady state "
             "(continuous: what the rate keeps in flight by Little's law), at most the "
             "requests at once")  # fmt: skip


SPREAD_HELP = (
    "each simulated request's prompt and output drawn within the stated lengths x "
    "(1 ± spread), as benchmarks' random datasets draw them (vLLM's "
    "--random-range-ratio; SGLang's default: 1 around half its stated lengths)"
)


OVERLAP_HELP = ("two micro-batches a step, each one's expert dispatch and combine beside the "
                "other's compute (SGLang's --enable-two-batch-overlap, vLLM's --enable-dbo); "
                "each reads the weights, so small decode batches lose")  # fmt: skip


def _inputs() -> dict[str, Any]:
    problems = start("serve", SERVE)
    warn_unused(problems)
    with st.form("serve_inputs"):
        c = st.columns(4)
        c[0].selectbox("model", choices("model"), key="serve_model")
        c[1].selectbox("device", device_choices(), key="serve_hardware")
        c[2].selectbox("weights", PRECISIONS, key="serve_precision")
        c[3].selectbox("KV cache", ("auto", *KV_DTYPES), key="serve_kv_dtype",
                       help="auto: the engine's rule (the weights' 16-bit dtype; "
                       "TensorRT-LLM: fp8 beside fp8 weights)")  # fmt: skip
        c = st.columns(4)
        c[0].number_input("tensor parallel", 1, 64, key="serve_tp")
        c[1].number_input("prompt tokens", 1, 2**24, key="serve_input")
        c[2].number_input("generated tokens", 1, 2**24, key="serve_output")
        c[3].number_input("requests at once (a replica)", 1, 2**20, key="serve_batch",
                          help="sequences one replica holds at once: the dp replicas "
                          "serve that many each")  # fmt: skip
        c = st.columns(4)
        c[0].number_input("replicas (dp)", 1, 4096, key="serve_dp")
        c[1].number_input("expert parallel (ep)", 1, 4096, key="serve_ep", help=EP_HELP)
        c[2].number_input("pipeline stages (pp)", 1, 256, key="serve_pp")
        c[3].selectbox("arrival", ARRIVALS, key="serve_arrival", help=ARRIVAL_HELP)
        c = st.columns(4)
        c[0].number_input("speculative: draft tokens (0: off)", 0, 16, key="serve_draft_tokens",
                          help="tokens a one-layer drafter (EAGLE head, MTP module) proposes "
                          "per step; one pass of the model verifies them")  # fmt: skip
        c[1].number_input("acceptance per drafted token", 0.01, 1.0, key="serve_acceptance",
                          help="the chance the model accepts a drafted token: the workload's "
                          "and the drafter's (DeepSeek-V3's MTP: 0.85-0.9)")  # fmt: skip
        c[2].number_input("prefill replicas (0: colocated)", 0, 4096,
                          key="serve_prefill_replicas", help=POOL_HELP)  # fmt: skip
        c[3].number_input("prefill replica tp", 1, 64, key="serve_prefill_tp")
        c = st.columns(4)
        c[0].number_input("requests/s (0: the batch at once)", 0.0, 1e6,
                          key="serve_request_rate", help=RATE_HELP)  # fmt: skip
        c[1].selectbox("serving engine", tuple(ENGINES), key="serve_engine", help=ENGINE_HELP,
                       format_func=lambda k: f"{k}: {ENGINES[k].title}")  # fmt: skip
        c[2].number_input("length spread (with a rate)", 0.0, 1.0, key="serve_length_spread",
                          help=SPREAD_HELP)  # fmt: skip
        c[3].selectbox("two-batch overlap (ep > tp)", ("off", "on"), key="serve_batch_overlap",
                       help=OVERLAP_HELP)  # fmt: skip
        c = st.columns(4)
        c[0].number_input(
            "RoPE scaling (x the trained positions)", 1.0, 1024.0, key="serve_rope_scaling",
            help="a context past the model's trained positions, as YaRN stretches them (the "
            "CLI's --rope-scaling): 4 for Qwen's 4x, 40 for DeepSeek-V3's")  # fmt: skip
        c[1].selectbox("fp8 scaling (fp8 weights)", FP8_SCALINGS, key="serve_fp8_scaling",
                       help="auto: the model's own fp8 checkpoint's (128 x 128 blocks for "
                       "DeepSeek-V3 and Qwen3, whose experts vLLM and SGLang run in Triton); "
                       "tensor; block")  # fmt: skip
        st.form_submit_button("Estimate", type="primary")
    return finish("serve", SERVE)


def _estimate(v: dict[str, Any], batch: int, rated: bool = False) -> ServeEstimate:
    return serve(get_model(v["model"]), _spec(v, batch, rated), get_hardware(v["hardware"]))


def _spec(v: dict[str, Any], batch: int, rated: bool = False) -> ServeSpec:
    drafted = v["draft_tokens"] > 0
    rate = v["request_rate"] if rated and v["request_rate"] > 0 else None
    arrival = v["arrival"] if not rate or v["arrival"] != "together" else "poisson"  # the CLI's
    if rate is None and arrival == "poisson":  # the curve's batches: the engine kept full
        arrival = "continuous"
    spread = v["length_spread"] if rate and arrival == "poisson" else 0.0  # simulated only
    scaling = v["fp8_scaling"] if v["precision"] == "fp8" else "auto"  # said of fp8 weights
    spec = ServeSpec(input=v["input"], output=v["output"], batch=batch, tp=v["tp"],
                     pp=v["pp"], dp=v["dp"], ep=v["ep"], arrival=arrival, request_rate=rate,
                     precision=v["precision"], engine=v["engine"],
                     kv_dtype=None if v["kv_dtype"] == "auto" else v["kv_dtype"],
                     draft_tokens=v["draft_tokens"],
                     acceptance=v["acceptance"] if drafted else None,
                     prefill_replicas=v["prefill_replicas"],
                     prefill_tp=v["prefill_tp"] if v["prefill_replicas"] else None,
                     length_spread=spread, rope_scaling=v["rope_scaling"],
                     batch_overlap=v["batch_overlap"] == "on",
                     fp8_scaling=scaling)  # fmt: skip
    return spec


def _answer(v: dict[str, Any]) -> ServeAnswer:
    """The CLI's answer (:func:`costmodel.answers.serve.answer`) to the page's inputs."""
    spec = _spec(v, v["batch"], rated=True)
    return answer(get_model(v["model"]), spec, get_hardware(v["hardware"]))


def _curve(v: dict[str, Any], most: int) -> list[dict[str, Any]]:
    """Throughput and TPOT at batches from 1 to the most that fit (log-spaced)."""
    batches = sorted({int(b) for b in np.geomspace(1, max(most, 1), 24)})
    rows = []
    for b in batches:
        est = _estimate(v, b)
        rows.append({"batch": b, "TPOT (ms)": est["time_s.tpot"] * 1e3,
                     "output tokens/s": est["throughput.output_tokens_per_s"],
                     "TTFT (s)": est["time_s.ttft"]})  # fmt: skip
    return rows


def _charts(v: dict[str, Any], est: ServeEstimate) -> None:
    rows = _curve(v, est["max_batch"])
    tips = ["batch:Q", "TPOT (ms):Q", "output tokens/s:Q", "TTFT (s):Q"]
    line = (
        alt.Chart(
            alt.Data(values=rows), title="Throughput against latency, batch 1 to the most that fits"
        )
        .mark_line(point=True)
        .encode(
            x=alt.X("TPOT (ms):Q", scale=alt.Scale(zero=False), axis=alt.Axis(format=",.4~g")),
            y=alt.Y("output tokens/s:Q"),
            tooltip=tips,
        )
    )  # one TPOT (host-bound) read 43.290900
    st.vega_lite_chart(line.to_dict(validate=False), width="stretch")
    mem = "memory_bytes_per_device."
    used = {"weights": est[mem + "weights"], "KV cache": est[mem + "kv_cache_paged"],
            "workspace": est[mem + "workspace"], "drafter": est[mem + "drafter"]}  # fmt: skip
    used["free"] = max(0.0, est[mem + "budget"] - sum(used.values()))
    used = {k: x for k, x in used.items() if x > 0 or k == "free"}  # no legend for no bar
    parts = [{"part": k, "GiB": x / GIB, "memory": fmt_bytes(x), "of": "a device"}
             for k, x in used.items()]  # fmt: skip
    title = "Memory per device (of the engine's share)"
    legend = alt.Legend(orient="bottom", title=None)
    bar = (alt.Chart(alt.Data(values=parts), title=title).mark_bar(size=36)
           .encode(x=alt.X("GiB:Q", stack="zero", title="GiB"), y=alt.Y("of:N", title=None),
                   color=alt.Color("part:N", sort=list(used), legend=legend),
                   order=alt.Order("order:Q"), tooltip=["part:N", "memory:N"])
           .transform_calculate(order=f"indexof({list(used)!r}, datum.part)")
           .properties(height=230))  # Streamlit fits axis and legend in it (a probe)  # fmt: skip
    st.vega_lite_chart(bar.to_dict(validate=False), width="stretch")


def serve_page() -> None:
    st.title("Serve: KV cache, latency and throughput")
    v = _inputs()
    if v["arrival"] == "poisson" and v["request_rate"] <= 0:  # the CLI refuses it too
        st.error("arrival **poisson** simulates requests arriving at random at a rate: set "
                 "**request rate** above 0, or pick continuous or together")  # fmt: skip
        return
    try:
        ans = _answer(v)
    except SpecError as err:
        st.error(in_words(err.message))
        return
    est = ans.estimate
    if v["arrival"] == "together" and v["request_rate"] > 0:  # the CLI's --request-rate rule
        st.info("A request rate is served as random (poisson) arrivals, simulated one by one "
                "with their queueing, as the CLI's --request-rate: arrival **together** "
                "applies to a static batch without a rate.")  # fmt: skip
    if not ans.fits:
        st.error(f"**Does not fit**: {fmt_bytes(est['memory_bytes_per_device.total'])} of "
                 f"{fmt_bytes(est['memory_bytes_per_device.budget'])} per device; "
                 f"{ans.how_many()}. Nearest fit: "
                 f"{in_words(str(ans.nearest))}. No TTFT, TPOT or throughput for a batch "
                 "that does not fit.")  # fmt: skip
    else:  # the CLI's verdict: a load that fits memory but not the deployment warns
        head = ans.headline()
        shown = st.success if head == "fits" else st.warning
        shown(f"**{head[0].upper()}{head[1:]}**: "
              f"{fmt_bytes(est['memory_bytes_per_device.total'])} of "
              f"{fmt_bytes(est['memory_bytes_per_device.budget'])} per device; "
              f"{ans.how_many()}; {in_words(', '.join(est.notes))}.")  # fmt: skip
    default_engine = v["engine"] == DEFAULT_ENGINE  # said as the CLI says it (a probe)
    said = assumptions(_spec(v, v["batch"], rated=True), engine_defaulted=default_engine)
    st.caption(f"Assumed: {in_words(said)}.")
    for text in ans.caveats:
        st.warning(text)
    share = "its share of tp" if est["kv_split_over_tp"] else "whole on each of the tp"
    per_token = (f"KV cache per token (a device: {share} {v['tp']})" if v["tp"] > 1
                 else "KV cache per token")  # the CLI's words (a probe)  # fmt: skip
    if not ans.fits:
        st.metric(per_token, f"{est['kv_bytes_per_token']:,} B")
        return
    st.markdown(f"**Limited by** {limited_by(est.values, v['output'])}.")
    c = st.columns(5)
    c[0].metric(per_token, f"{est['kv_bytes_per_token']:,} B")
    grows = " of the simulated requests: grows with their count" * ans.overloaded
    static = v["arrival"] == "together" and not v["request_rate"]  # the CLI's label
    ttft = "TTFT (the batch's prefill)" if static else f"TTFT (mean{grows})"
    c[1].metric(ttft, f"{est['time_s.ttft'] * 1e3:,.1f} ms")
    c[2].metric("TPOT (mean)", f"{est['time_s.tpot'] * 1e3:,.2f} ms" if v["output"] > 1
                else "none (one token)")  # fmt: skip
    c[3].metric("output tokens/s", f"{est['throughput.output_tokens_per_s']:,.0f}")
    c[4].metric("memory per device", fmt_bytes(est["memory_bytes_per_device.total"]))
    if "workload.ttft_s.p99" in est.values:
        w = "workload."
        st.caption(f"Simulated, {est[w + 'counted']:,} requests counted: TTFT p50 "
                   f"{est[w + 'ttft_s.p50'] * 1e3:,.1f} ms, p90 {est[w + 'ttft_s.p90'] * 1e3:,.1f}"
                   f" ms, p99 {est[w + 'ttft_s.p99'] * 1e3:,.1f} ms; TPOT p50 "
                   f"{est[w + 'tpot_s.p50'] * 1e3:,.2f} ms, p99 "
                   f"{est[w + 'tpot_s.p99'] * 1e3:,.2f} ms; {est[w + 'requests_per_s']:,.3g} "
                   "requests/s served.")  # fmt: skip
    if "speculative.tokens_per_cycle" in est.values:
        st.caption(f"Speculative decoding: {est['speculative.tokens_per_cycle']:.2f} tokens per "
                   f"draft-and-verify cycle of "
                   f"{est['time_s.speculative.cycle'] * 1e3:,.2f} ms (a plain decode step: "
                   f"{est['time_s.decode_step.total'] * 1e3:,.2f} ms).")  # fmt: skip
    if "disaggregated.prefill_requests_per_s" in est.values:
        d = "disaggregated."
        st.caption(
            f"Disaggregated: the prefill pool serves "
            f"{est[d + 'prefill_requests_per_s']:,.2f} requests/s, the decode pool "
            f"{est[d + 'decode_requests_per_s']:,.2f}; "
            f"{est[d + 'prefill_replicas_to_balance']:.2f} prefill replicas would match "
            f"it; a prompt's cache hand-off takes {est[d + 'handoff_s'] * 1e3:,.1f} ms."
        )
    _charts(v, est)
