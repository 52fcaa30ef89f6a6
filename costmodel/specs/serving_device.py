"""What a serving question needs of its model and device (:func:`check`), and the dtype its
matmuls run at there (:func:`gemm_dtype`); the spec's own fields are checked by
``costmodel.specs.serving.ServeSpec``."""

from __future__ import annotations

from typing import Any

from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.serving import MAX_ROPE_SCALING, ServeSpec


def check(model: Any, spec: ServeSpec, hw: Any) -> None:
    """What depends on the model and the device: the context within the model's positions
    (stretched by ``rope_scaling``), tp dividing the heads (and the kv heads, or they divide
    tp), a precision the device computes in, and a cache dtype it computes in or, for an
    fp8 or int8 cache on a GPU, stores and converts in the attention kernel (vLLM's fp8
    cache: "not limited on Hopper. Volta/Ampere are both ok", vllm-project/vllm#2279; the
    attention is priced in 16 bits either way), and an attention kernel the device's
    profile measures."""
    positions = int(model.max_positions * spec.rope_scaling)
    if spec.context > positions:
        if model.pos == "learned":
            why = "learned positions cannot be stretched"
        elif (need := spec.context / model.max_positions) <= MAX_ROPE_SCALING:
            why = (f"RoPE scaling by {need:.3g}x (YaRN, Peng et al. 2023; --rope-scaling) "
                   f"would allow it")  # fmt: skip
        else:  # past any scaling taken (a probe: the app refused the factor it was told)
            why = (f"no RoPE scaling taken reaches it ({need:,.0f}x; at most "
                   f"{MAX_ROPE_SCALING:,}x): a shorter input or output")  # fmt: skip
        raise SpecError(
            "context",
            f"context (input + output = {spec.context:,}) exceeds {model.name}'s "
            f"{positions:,} positions; {why}",
        )
    _check_ep(model, spec)
    if spec.pp > model.n_layers:
        raise SpecError("pp", f"pp ({spec.pp}) must be <= the {model.n_layers} layers (a stage "
                        "holds at least one)")  # fmt: skip
    if spec.arrival != "together" and (spec.draft_tokens or spec.prefill_replicas or spec.pp > 1):
        raise SpecError(
            "arrival",
            "continuous batching (concurrency, a request rate or arrival continuous) is "
            "modelled for tp, ep and dp replicas: not yet with speculative decoding, "
            "disaggregated prefill or pp",
        )
    if spec.pp > 1 and (spec.draft_tokens or spec.prefill_replicas):
        raise SpecError("pp", "pp > 1 with speculative decoding or disaggregated prefill is "
                        "not modelled yet: use tp (and ep) for those")  # fmt: skip
    degrees = [("tp", spec.tp)]
    if spec.prefill_replicas:
        degrees.append(("prefill_tp", spec.prefill_degree))
    for name, degree in degrees:
        checks.divides(name, degree, "n_heads", model.n_heads)
        kv = model.n_kv_heads
        if not model.mla and kv % degree and degree % kv:
            raise SpecError(name, f"{name} ({degree}) and the {kv} kv heads must divide one "
                            "another")  # fmt: skip
    for field, dtype in (("precision", spec.precision), ("kv_dtype", spec.kv_dtype)):
        needs = (
            gemm_dtype(dtype, hw)
            if field == "precision"
            else {"nvfp4": "fp4", "mxfp4": "bf16"}.get(dtype, dtype)
        )
        stored = field == "kv_dtype" and dtype in ("fp8", "int8") and hw.kind == "gpu"
        if not (stored or hw.peak_flops.get(needs)):
            how = " (MXFP4 weights dequantized to bf16 matmuls where the device has no fp4)" \
                if dtype == "mxfp4" else ""  # fmt: skip
            raise SpecError(field, f"{field} {dtype}: {hw.name} has no {needs} support{how}")
    kernel = spec.attention_kernel
    if kernel != "auto" and spec.precision == "fp32":  # flash kernels take 16-bit inputs
        raise SpecError("attention_kernel", f"attention_kernel {kernel}: no flash kernel runs "
                        "fp32 attention (auto: the device's measured fp32 rate)")  # fmt: skip
    if kernel != "auto" and kernel not in hw.attention_kernels:
        have = ", ".join(hw.attention_kernels) or "none: auto, its measured attention rate"
        raise SpecError("attention_kernel", f"attention_kernel {kernel}: {hw.name} has no "
                        f"measured rate for it (has {have})")  # fmt: skip


def gemm_dtype(precision: str, hw: Any) -> str:
    """The dtype a serving step's matmuls run at for ``precision`` weights on ``hw``
    (``PRECISIONS``): NVFP4's fp4; MXFP4's fp8 where the device computes fp4 (W4A8) and its
    16-bit otherwise (W4A16); fp8 weights on a GPU without fp8 matmuls dequantized to
    16-bit ones (W8A16: vLLM's FP8 Marlin on Turing and Ampere, "FP8 models will run on
    compute capability >= 7.5 (Turing) as weight-only W8A16, utilizing FP8 Marlin", vLLM's
    docs features/quantization/fp8.md; vllm-project/vllm PR #5975); the rest their own."""
    if precision == "nvfp4":
        return "fp4"
    if precision == "mxfp4":
        return "fp8" if hw.peak_flops.get("fp4") else "bf16"
    if precision == "fp8" and hw.kind == "gpu" and not hw.peak_flops.get("fp8"):
        return "bf16"
    return precision


def _check_ep(model: Any, spec: ServeSpec) -> None:
    """ep splits a mixture-of-experts model's routed experts over whole replicas' tp ranks."""
    if spec.ep == 1:
        return
    if not model.n_experts:
        raise SpecError("ep", f"ep > 1 needs a mixture-of-experts model ({model.name} has no "
                        "routed experts)")  # fmt: skip
    slots = model.n_experts + spec.redundant_experts
    if slots % spec.ep:
        field = "redundant_experts" if spec.redundant_experts else "ep"
        raise SpecError(field, f"ep ({spec.ep}) must divide the {model.n_experts} routed experts "
                        f"plus {spec.redundant_experts} redundant ({slots}): each device holds "
                        "as many (--redundant-experts adds copies to make it divide)")  # fmt: skip
    if spec.ep % spec.tp or spec.dp % (spec.ep // spec.tp):
        raise SpecError("ep", f"ep ({spec.ep}) must span whole replicas: a multiple of tp "
                        f"({spec.tp}) whose ep / tp divides dp ({spec.dp})")  # fmt: skip
