"""Serving engines as kinds (``costmodel.specs.engines``): each default is the one its
release's source or documentation states (the quote in the engine's ``sources``), the host
times are what the cited measurements give, and a workload takes its engine's defaults."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from costmodel import get_hardware, get_model
from costmodel.serving import serve
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT, ENGINES, Engine, engine, vllm
from costmodel.specs.serving import ServeSpec
from validate.published.serving import engine_of

QUOTED = ("max_seqs", "token_budget", "memory_utilization")
"""The numeric defaults every serving engine quotes its source for."""


def _quoted_numbers(quote: str) -> set[float]:
    code = " ".join(re.findall(r"`([^`]*)`", quote))
    return {float(n) for n in re.findall(r"\d+(?:\.\d+)?", code)}


@pytest.mark.parametrize("name", [n for n in ENGINES if n != "eager"])
def test_every_default_is_the_number_its_source_states(name):
    kind = ENGINES[name]
    for field in QUOTED:
        quote = kind.sources[field]
        assert float(getattr(kind, field)) in _quoted_numbers(quote), (name, field, quote)
    cache = kind.sources["fp8_cache_with_fp8_weights"]
    assert kind.fp8_cache_with_fp8_weights == ("FP8 as well" in cache), (name, cache)
    assert kind.fp8_cache_with_fp8_weights != ('"auto"' in cache), (name, cache)


def test_sglang_takes_its_memory_share_by_tp_as_its_source_states():
    quote = ENGINES["sglang"].sources["memory_by_tp"]
    stated = [(int(tp), float(share)) for tp, share in re.findall(r">= (\d+): (0\.\d+)", quote)]
    assert list(ENGINES["sglang"].memory_by_tp[:-1]) == stated
    assert [ServeSpec(input=8, output=8, tp=tp, engine="sglang").memory_utilization
            for tp in (1, 2, 4, 8)] == [0.88, 0.87, 0.85, 0.81]  # fmt: skip


def test_vllm_v0_host_time_is_vidurs_profile_fitted():
    """2.03 ms + 172 us a sequence reproduces each of Vidur's four batches within 11 %; 0.6
    moves the output processing (1.6-9.1 ms of it) beside the device."""
    rows = vllm.VIDUR_A100
    batch = np.asarray(rows["batch"], dtype=float)
    total = sum(np.asarray(v) for k, v in rows.items() if k != "batch") * 1e-3
    fitted = np.array([ENGINES["vllm-0.5"].host_s(b) for b in batch])
    assert np.max(np.abs(fitted / total - 1)) < 0.11
    v06 = ENGINES["vllm-0.6"]
    assert v06.host_s(32) == pytest.approx(ENGINES["vllm-0.5"].host_s(32), rel=1e-9)
    outputs = np.asarray(rows["process_model_outputs"]) * 1e-3
    beside = np.array([v06.async_step_s + v06.async_seq_s * b for b in batch])
    assert np.max(np.abs(beside / outputs - 1)) < 0.17


def test_vllm_v1_host_time_is_the_measured_gap():
    """5-6 ms between decode steps at batch 256 in step (issue #10634); 150-170 us of it
    left with asynchronous scheduling (PR #11133)."""
    assert ENGINES["vllm-0.8"].host_s(256) == pytest.approx(5.5e-3)
    v1 = ENGINES["vllm"]
    assert v1.host_s(256) == pytest.approx(5.5e-3)
    assert v1.iteration_s(0.0, 256) == pytest.approx(5.5e-3)  # host-bound: all of it
    assert v1.iteration_s(1.0, 256) == pytest.approx(1.0 + 0.16e-3)  # device-bound: the gap


def test_an_iteration_adds_what_the_device_waits_for_and_overlaps_the_rest():
    kind = Engine(name="x", title="x", max_seqs=1, token_budget=1, memory_utilization=0.9,
                  fp8_cache_with_fp8_weights=False, step_s=1.0, seq_s=0.5, async_step_s=2.0,
                  async_seq_s=1.0)  # fmt: skip
    assert kind.iteration_s(device=10.0, sequences=2) == 2.0 + 10.0
    assert kind.iteration_s(device=1.0, sequences=2) == 2.0 + 4.0


def test_a_workload_takes_its_engines_defaults():
    fp8 = {"input": 128, "output": 128, "precision": "fp8"}
    assert ServeSpec(**fp8, engine="trtllm").kv_dtype == "fp8"
    assert ServeSpec(**fp8, engine="vllm").kv_dtype == "bf16"
    assert ServeSpec(**fp8, engine="vllm", kv_dtype="fp8").kv_dtype == "fp8"
    assert ServeSpec(input=8, output=8).engine == DEFAULT
    with pytest.raises(SpecError) as err:
        ServeSpec(input=8, output=8, engine="tgi")
    assert err.value.field == "engine"
    with pytest.raises(SpecError) as err:
        engine("tgi")
    assert err.value.field == "engine"


def test_an_older_engine_is_slower_where_the_host_binds():
    """Llama-3-8B decoding 64 sequences on one H100: vLLM 0.5's host work in step with the
    device costs most; 0.6 moves its output processing aside; V1 least; TensorRT-LLM prices
    none."""
    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    tpot = {name: serve(model, ServeSpec(input=1000, output=200, batch=64, engine=name),
                        hw)["time_s.tpot"] for name in ("vllm-0.5", "vllm-0.6", "vllm-0.8",
                                                        "vllm", "trtllm")}  # fmt: skip
    assert tpot["vllm-0.5"] > tpot["vllm-0.6"] > tpot["vllm-0.8"] > tpot["vllm"]
    assert tpot["vllm"] >= tpot["trtllm"]
    assert tpot["vllm-0.5"] - tpot["trtllm"] == pytest.approx(ENGINES["vllm-0.5"].host_s(64))


@pytest.mark.parametrize(("engine_name", "version", "source", "kind"), [
    ("TensorRT-LLM", "0.17", "trtllm-perf-overview-v0.17", "trtllm"),
    ("NVIDIA NIM for LLMs", "1.8", "nim", "trtllm"),
    ("vLLM", "0.5.3", "x", "vllm-0.5"),
    ("vLLM", "0.6.3.post1", "x", "vllm-0.6"),
    ("vLLM (ROCm fork)", "0.10.0 (ROCm 6.4.1)", "x", "vllm-0.8"),
    ("vLLM", "0.11.0", "x", "vllm-0.8"),  # async scheduling became the default in 0.14.0
    ("vLLM", "0.13.0", "x", "vllm-0.8"),
    ("vLLM", "0.14.0", "x", "vllm"),
    ("vLLM", "not stated", "blog-2026-04-22-x", "vllm"),
    ("vLLM", "not stated", "oracle-oci-blog-2024-10-10-x", "vllm-0.6"),
    ("vLLM", "not stated", "blog-2024-06-01-x", "vllm-0.5"),
    ("vLLM", "not stated", "ci-build", "vllm"),
])  # fmt: skip
def test_a_published_run_is_priced_on_the_engine_it_states(engine_name, version, source, kind):
    assert engine_of({"engine": engine_name, "engine_version": version, "source": source}) == kind


def test_the_eager_reference_is_host_bound_on_a_catalog_gpu(capsys):
    """Issue 60's fifth probe: on the catalog's H100 (no ``dispatch_s`` of its own) the
    eager reference engine's TPOT was 7.25 ms at batch 1, vLLM V1's 7.40 ms: its dispatch
    was 0. It now pays the engine's measured 30.9 us per eager kernel on an x86 GPU node,
    op by op, and is host-bound well above vLLM."""
    import json

    from costmodel.cli import main

    def tpot(engine: str) -> float:
        argv = ["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--input", "1024",
                "--output", "256", "--batch", "8", "--engine", engine, "--json"]  # fmt: skip
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)["time_s"]["tpot"]

    eager, vllm = tpot("eager"), tpot("vllm")
    assert eager > 3 * vllm
    argv = ["serve", "--model", "llama3-8b", "--hardware", "h100-sxm", "--input", "1024",
            "--output", "256", "--batch", "8", "--engine", "eager"]  # fmt: skip
    assert main(argv) == 0
    assert "limited by             decode: the host" in capsys.readouterr().out


@pytest.mark.parametrize("name", [n for n in ENGINES if ENGINES[n].prefill_attention])
def test_a_prefill_kernel_is_the_one_its_source_states(name):
    """An engine that prices FlashAttention-3's rate quotes where its source runs FA3 (or a
    Hopper kernel of FA3's design: TMA, warp-specialized) by default."""
    kind = ENGINES[name]
    assert kind.prefill_attention == ("fa3",)
    assert re.search(r"FA3|fa_version = 3|tma_ws_sm90", kind.sources["prefill_attention"])


def test_a_prompt_runs_at_the_rate_of_the_kernel_its_engine_runs_on_that_device():
    """vLLM V1 prefills at FlashAttention-3's rate on an H100 (its profile measures it),
    vLLM V0 at FlashAttention-2's (the device's default); an A100's profile has no FA3, a
    B200's no kernel table, and fp32 no flash kernel: the device's default there."""
    from costmodel.serving.estimate import prompt_attention_rate

    h100, a100, b200 = (get_hardware(n) for n in ("h100-sxm", "a100-80gb", "b200"))
    spec = ServeSpec(input=20000, output=100, engine="vllm")

    def rate(hw, kernel, s=spec, dtype="bf16"):
        return float(hw.attention_peak(dtype, kernel=kernel, seq=s.input))

    assert prompt_attention_rate(spec, h100) == rate(h100, "fa3")
    assert prompt_attention_rate(spec, h100) > 1.7 * rate(h100, "fa2")  # 0.646 vs 0.357
    v0 = ServeSpec(input=20000, output=100, engine="vllm-0.5")
    assert prompt_attention_rate(v0, h100) == rate(h100, "fa2")
    assert prompt_attention_rate(spec, a100) == rate(a100, "fa2")
    assert prompt_attention_rate(spec, b200) == rate(b200, "auto")
    fp32 = ServeSpec(input=2000, output=10, engine="vllm", precision="fp32")
    assert prompt_attention_rate(fp32, h100) == rate(h100, "auto", fp32, "fp32")


def test_an_engine_on_hopper_prefills_a_long_prompt_faster_than_v0():
    """The same 8,000-token prompt of Llama 3 8B on one H100: its prefill's attention core
    takes longer under vLLM V0 (FA2) than V1 (FA3) by the two kernels' rates at that
    length; the matmuls are alike."""
    model, hw = get_model("llama3-8b"), get_hardware("h100-sxm")
    v1 = serve(model, ServeSpec(input=8000, output=10, batch=1, engine="vllm"), hw)
    v0 = serve(model, ServeSpec(input=8000, output=10, batch=1, engine="vllm-0.5"), hw)
    ratio = hw.attention_peak("bf16", "fa3", seq=8000) / hw.attention_peak("bf16", "fa2", seq=8000)
    core = "time_s.prefill.attention_compute"
    assert v0[core] / v1[core] == pytest.approx(float(ratio), rel=1e-9)
    assert ratio > 1.7
    assert v0["time_s.prefill.matmuls_compute"] == v1["time_s.prefill.matmuls_compute"]


def test_an_answer_names_the_kernel_its_prompts_are_priced_at():
    """The last note says which kernel's rate a prompt's attention took and why: the
    engine's on a Hopper GPU, the device's default kernel on an A100, a B200's measured rate
    (no per-kernel table)."""
    model = get_model("llama3-8b")
    spec = ServeSpec(input=2000, output=100, batch=4)
    said = {name: serve(model, spec, get_hardware(name)).notes[-1]
            for name in ("h100-sxm", "a100-80gb", "b200")}  # fmt: skip
    assert said["h100-sxm"] == (
        "prompts' attention at FlashAttention-3's measured rate: the kernel vLLM V1 "
        "(asynchronous scheduling) runs on h100-sxm"
    )
    assert said["a100-80gb"].startswith("prompts' attention at FlashAttention-2's measured rate")
    assert said["b200"] == "prompts' attention at b200's measured bf16 attention rate"


def test_a_deployment_may_state_the_kernel_it_runs(capsys):
    """``attention_kernel`` overrides the engine's choice (vLLM with
    ``VLLM_FLASH_ATTN_VERSION=2`` on an H100 prefills at FA2's rate, said in the note); a
    kernel the device's profile does not measure is one error naming the field, in Python
    and on the command line."""
    from costmodel.cli import main
    from costmodel.serving.estimate import prompt_attention_rate

    h100 = get_hardware("h100-sxm")
    spec = ServeSpec(input=8000, output=10, engine="vllm", attention_kernel="fa2")
    assert prompt_attention_rate(spec, h100) == float(h100.attention_peak("bf16", "fa2", seq=8000))
    est = serve(get_model("llama3-8b"), spec, h100)
    assert est.notes[-1].endswith("FlashAttention-2's measured rate: as asked (--attention-kernel)")
    with pytest.raises(SpecError, match="attention_kernel fa3: b200 has no measured rate"):
        serve(get_model("llama3-8b"), replace(spec, attention_kernel="fa3"), get_hardware("b200"))
    with pytest.raises(SpecError, match="attention_kernel fa2: no flash kernel runs fp32"):
        serve(get_model("llama3-8b"), replace(spec, precision="fp32"), h100)
    with pytest.raises(SpecError, match="attention_kernel must be one of auto, fa2, fa3"):
        ServeSpec(input=8, output=8, attention_kernel="fa4")
    code = main(["serve", "--model", "llama3-8b", "--hardware", "b200", "--input", "800",
                 "--attention-kernel", "fa3"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--attention-kernel fa3: b200 has no measured rate" in err
    assert "Traceback" not in err
