"""Block-scaled fp8 checkpoints in serving (``ServeSpec.fp8_scaling``): DeepSeek-V3's and
Qwen3's own fp8 weights carry one scale per 128 x 128 block, and vLLM and SGLang run their
routed experts in Triton's ``fused_moe`` (``Engine.block_fp8_moe``), at the block-scaled
Triton GEMM's measured share of a 16-bit GEMM's rate (``efficiency.serve_block_fp8``)."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from costmodel import get_hardware, get_model
from costmodel.catalog.presets import FP8_BLOCK
from costmodel.serving import serve
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import ENGINES
from costmodel.specs.serving import ServeSpec

SIDE_BY_SIDE = {  # tokens: (torch bf16, w8a8 block-fp8 Triton) TFLOP/s
    512: (566.262626, 305.159322),
    1024: (619.771938, 366.839772),
    2048: (648.192575, 396.032348),
    4096: (715.781529, 402.982983),
    8192: (666.385367, 406.511360),
}
"""vllm-project/vllm PR #23280 (2025-09-10), 'BF16 vs W8A8 Block FP8 GEMMs' on an H100 80GB
HBM3, DeepSeek-V3's N=2112 K=7168, block_size (128, 128), the rows of 512-8,192 tokens
(below 512 both are memory-bound, where serving prices bytes, not this rate)."""

SPEC = ServeSpec(input=4000, output=100, batch=64, tp=8, precision="fp8")


def test_the_hopper_share_is_the_median_of_the_cited_side_by_side_points():
    shares = [block / bf16 for bf16, block in SIDE_BY_SIDE.values()]
    assert min(shares) > 0.5 and max(shares) < 0.62
    share = round(statistics.median(shares), 2)
    for name in ("h100-sxm", "h100-sxm-96gb", "h800", "h20", "gh200", "h200"):
        assert get_hardware(name).efficiency["serve_block_fp8"] == share == 0.59
    for name in ("a100-80gb", "b200", "mi300x"):  # measured on Hopper only
        assert "serve_block_fp8" not in get_hardware(name).efficiency


@pytest.mark.parametrize("name", list(ENGINES))
def test_an_engine_that_runs_triton_experts_quotes_its_source(name):
    kind = ENGINES[name]
    if kind.block_fp8_moe:
        assert kind.block_fp8_moe == "triton"
        assert "Triton" in kind.sources["block_fp8_moe"]
        assert "fused_moe" in kind.sources["block_fp8_moe"]
    assert bool(kind.block_fp8_moe) == name.startswith(("vllm", "sglang"))


def test_deepseek_v3s_fp8_experts_run_at_the_triton_share_of_the_16_bit_rate():
    """The routed experts' compute takes exactly the ratio of the fp8 rate to the block
    kernel's longer than with per-tensor scales; the dense matmuls and attention are alike."""
    model, hw = get_model("deepseek-v3"), get_hardware("h200")
    assert "deepseek-v3" in FP8_BLOCK and "mixtral-8x7b" not in FP8_BLOCK
    block = serve(model, SPEC, hw)
    tensor = serve(model, replace(SPEC, fp8_scaling="tensor"), hw)
    ratio = hw.serve_flops("fp8") / (hw.serve_flops("bf16") * 0.59)
    key = "time_s.prefill.experts_compute"
    assert block[key] / tensor[key] == pytest.approx(ratio, rel=1e-12)
    assert ratio == pytest.approx(hw.peak("fp8") / hw.peak("bf16") / 0.59, rel=1e-12)  # 3.4x
    for same in ("time_s.prefill.matmuls_compute", "time_s.prefill.attention_compute"):
        assert block[same] == tensor[same]
    assert block["time_s.ttft"] > tensor["time_s.ttft"]
    assert "block-scaled fp8 Triton kernel's measured rate, 0.59" in " ".join(block.notes)


def test_only_block_scaled_fp8_under_a_triton_engine_on_a_measured_device_changes():
    """TensorRT-LLM (DeepGEMM's grouped kernels), a device without the measurement, a
    per-tensor checkpoint (Mixtral) and 16-bit weights keep the fp8 or 16-bit rate; each
    says so where the checkpoint is block-scaled."""
    model = get_model("deepseek-v3")
    key = "time_s.prefill.experts_compute"
    for hw_name, engine in (("h200", "trtllm"), ("b200", "vllm")):
        hw = get_hardware(hw_name)
        spec = replace(SPEC, engine=engine)
        auto, tensor = serve(model, spec, hw), serve(model, replace(spec, fp8_scaling="tensor"), hw)
        assert auto[key] == tensor[key]
        assert f"block-scaled fp8 experts (deepseek-v3's fp8 checkpoint scales per 128 x 128 " \
               f"block) at {hw_name}'s fp8 rate" in " ".join(auto.notes)  # fmt: skip
    mixtral, h100 = get_model("mixtral-8x7b"), get_hardware("h100-sxm")
    spec = replace(SPEC, tp=2)
    assert serve(mixtral, spec, h100)[key] == serve(mixtral, replace(spec, fp8_scaling="tensor"),
                                                   h100)[key]  # fmt: skip
    asked = serve(mixtral, replace(spec, fp8_scaling="block"), h100)
    assert asked[key] > serve(mixtral, spec, h100)[key]
    assert "as asked (--fp8-scaling block)" in " ".join(asked.notes)
    bf16 = serve(model, replace(SPEC, precision="bf16", tp=8), get_hardware("h200"))
    assert not any("block-scaled" in n for n in bf16.notes)


def test_a_scaling_without_fp8_weights_is_one_error_naming_the_field(capsys):
    from costmodel.cli import main

    with pytest.raises(SpecError, match="fp8_scaling block needs precision fp8"):
        ServeSpec(input=8, output=8, fp8_scaling="block")
    with pytest.raises(SpecError, match="fp8_scaling must be one of auto, tensor, block"):
        ServeSpec(input=8, output=8, precision="fp8", fp8_scaling="row")
    code = main(["serve", "--model", "deepseek-v3", "--hardware", "h200", "--tp", "8",
                 "--input", "800", "--fp8-scaling", "block"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--fp8-scaling block needs --precision fp8" in err
    assert "Traceback" not in err
