"""What a serving estimate says beside its numbers (``ServeEstimate.notes``), and the one
choice they name that the spec does not hold: the fused-attention kernel a prompt runs on,
the engine's on this device (``Engine.prefill_attention``)."""

from __future__ import annotations

from typing import Any

from costmodel.serving import continuous, experts, queueing
from costmodel.serving.fp8 import block_fp8_triton, fp8_blocked
from costmodel.specs.hardware import FLASH_LESS_DTYPES, Hardware
from costmodel.specs.serving import ServeSpec
from costmodel.specs.serving_device import gemm_dtype

KERNEL_NAMES = {
    "fa2": "FlashAttention-2",
    "fa3": "FlashAttention-3",
    "cudnn": "cuDNN's fused attention",
    "triton-2022": "Triton's 2022 flash kernel",
}
"""How a note names a kernel family of ``Hardware.attention_kernels``."""


def prompt_kernel(spec: ServeSpec, hw: Hardware) -> tuple[str, str]:
    """(dtype, kernel family) of a prompt's attention: the activations' dtype (16 bits beside
    fp8 and fp4 GEMMs) and the family the engine's prefill runs on this device
    (``Engine.attention_kernel``) unless the spec names one (``ServeSpec.attention_kernel``),
    ``auto`` (the device's default) where the engine names none the device's profile
    measures or no flash kernel runs the dtype."""
    dtype = spec.precision if spec.precision in ("fp16", "fp32") else "bf16"
    if dtype in FLASH_LESS_DTYPES:
        return dtype, "auto"
    if spec.attention_kernel != "auto":  # as the deployment states it
        return dtype, spec.attention_kernel
    return dtype, spec.engine_kind.attention_kernel(hw.attention_kernels)


def kernel_note(spec: ServeSpec, hw: Hardware) -> str:
    """Which kernel's rate the prompts' attention core is priced at, and why."""
    dtype, kernel = prompt_kernel(spec, hw)
    if kernel != "auto":
        why = ("as asked (--attention-kernel)" if spec.attention_kernel != "auto" else
               f"the kernel {spec.engine_kind.title} runs on {hw.name}")  # fmt: skip
        return f"prompts' attention at {KERNEL_NAMES.get(kernel, kernel)}'s measured rate: {why}"
    default = next(iter(hw.attention_kernels), None)
    if dtype in FLASH_LESS_DTYPES or default is None:
        return f"prompts' attention at {hw.name}'s measured {dtype} attention rate"
    return (f"prompts' attention at {KERNEL_NAMES.get(default, default)}'s measured rate "
            f"({hw.name}'s default kernel)")  # fmt: skip


def block_fp8_note(model: Any, spec: ServeSpec, hw: Hardware) -> str | None:
    """Which rate a block-scaled fp8 checkpoint's routed experts are priced at, and why;
    None where the weights are not so scaled or the model routes no experts."""
    if not (model.n_experts and fp8_blocked(model, spec)):
        return None
    why = ("as asked (--fp8-scaling block)" if spec.fp8_scaling == "block" else
           f"{model.name}'s fp8 checkpoint scales per 128 x 128 block")  # fmt: skip
    title = spec.engine_kind.title
    if not block_fp8_triton(model, spec):
        return (f"block-scaled fp8 experts ({why}) at {hw.name}'s fp8 rate: {title} runs them "
                "in DeepGEMM's or CUTLASS's grouped kernels")  # fmt: skip
    if "serve_block_fp8" not in hw.efficiency:
        return (f"block-scaled fp8 experts ({why}) at {hw.name}'s fp8 rate: no block-scaled "
                "Triton GEMM is measured on it")  # fmt: skip
    return (
        f"routed experts at the block-scaled fp8 Triton kernel's measured rate, "
        f"{hw.eff('serve_block_fp8'):g} of 16-bit GEMMs' on {hw.name} ({why}; {title} runs "
        "them in Triton's fused_moe)"
    )


def for_estimate(
    model: Any, spec: ServeSpec, asked: int, out: dict[str, Any], hw: Hardware
) -> list[str]:
    """What the estimate assumes beyond the spec, the prompts' attention kernel last."""
    said = [f"decode at the mean cache of its steps, {spec.input + spec.output / 2:g} tokens"]
    computed = gemm_dtype(spec.precision, hw)
    if spec.precision == "fp8" and computed != "fp8":
        said.append(f"fp8 weights dequantized into {computed} matmuls: {hw.name} has no fp8 "
                    "matmuls (W8A16, as vLLM's FP8 Marlin runs them)")  # fmt: skip
    if spec.simulated:
        said = [queueing.note(spec, out)]
    if spec.prefill_replicas:
        said.append("disaggregated: TTFT is the mean over the batch of waiting for its prefill "
                    "wave; the throughput is the slower pool's steady rate")  # fmt: skip
    if spec.arrival == "continuous" and not spec.simulated:
        said += continuous.notes(spec, asked, out)
    if out["bytes_per_device.decode_step_experts"]:
        said.append("routed experts read by a decode step: uniform routing")
    if spec.tp > 1:
        said.append("tp all-reduces exposed (not overlapped)")
    if spec.ep > spec.tp:
        said.append(experts.overlap_note(spec))
    if (block := block_fp8_note(model, spec, hw)) is not None:
        said.append(block)
    said.append(kernel_note(spec, hw))
    return said
