"""Block-scaled fp8 checkpoints in serving: whether a model's fp8 weights carry one scale per
128 x 128 block (``ServeSpec.fp8_scaling``; ``auto``: the model's own fp8 checkpoint's,
``costmodel.catalog.presets.FP8_BLOCK``, each with its config's quote) and whether the
engine runs such routed experts in Triton's ``fused_moe`` (``Engine.block_fp8_moe``), priced
at ``efficiency.serve_block_fp8`` of the 16-bit rate (:meth:`Hardware.serve_grouped_flops`).
"""

from __future__ import annotations

from costmodel.catalog.presets import FP8_BLOCK
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import ServeSpec


def fp8_blocked(model: ModelSpec, spec: ServeSpec) -> bool:
    """Whether the weights are fp8 scaled per 128 x 128 block: as ``spec.fp8_scaling`` says,
    for ``auto`` as the model's own fp8 checkpoint is (DeepSeek-V3's, Qwen3's)."""
    if spec.precision != "fp8":
        return False
    if spec.fp8_scaling == "auto":
        return model.name in FP8_BLOCK
    return spec.fp8_scaling == "block"


def block_fp8_triton(model: ModelSpec, spec: ServeSpec) -> bool:
    """Whether the routed experts run block-scaled fp8 weights (:func:`fp8_blocked`) in a
    Triton kernel: the engine runs them in Triton's ``fused_moe`` at tp (vLLM, SGLang)."""
    return fp8_blocked(model, spec) and spec.engine_kind.block_fp8_moe == "triton"
