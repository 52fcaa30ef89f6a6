"""vLLM, by generation: V0 before 0.6 (``vllm-0.5``), V0 with asynchronous output
processing (``vllm-0.6``: 0.6-0.7), V1 with its scheduler in step with the device
(``vllm-0.8``: 0.8-0.13) and V1 with asynchronous scheduling (``vllm``: 0.14 on, the
current).

Defaults, from each release's own source (``SOURCES``): 256 sequences at most on V0, 1,024
on V1 on a GPU of >= 70 GiB (256 below; H100, H200, B200 and MI300X are priced with the
large values); ``gpu_memory_utilization`` 0.9; the cache ``auto`` (the model's dtype: a
16-bit cache beside fp8 weights unless ``--kv-cache-dtype fp8``); V1's
``max_num_batched_tokens`` 8,192 for ``vllm serve``; V0 prefills whole prompts, up to
max(max_model_len, 2,048) tokens a step.

Prefill attention: V0 runs vllm-flash-attn's FlashAttention-2 (the device's default kernel
here); V1 FlashAttention-3 on Hopper (``_FA3_ON_HOPPER``), FlashAttention-2 elsewhere. 0.7
(V0 by default) already picks FA3 on Hopper (PR #12093 landed in January 2025); its
kind (``vllm-0.6``) is priced as 0.6 ran, with FA2: an approximation for 0.7 on Hopper.

Block-scaled fp8 experts (DeepSeek-V3's and Qwen3's fp8 checkpoints): Triton's ``fused_moe``
in every generation (``_TRITON_BLOCK_MOE``: DeepGEMM's grouped kernels are not in vLLM's
wheels, and with them installed PR #29346 keeps Triton for the MoE at tp 8).

Host time per iteration (seconds):

- **V0 (0.5)**: everything in step with the device. Vidur's profile of vLLM on an A100
  host (Llama-2-7B, tp 1; microsoft/vidur ``data/profiling/a100/cpu_overheads.csv``):
  scheduling, sampling, input preparation, output processing and launch at batches 8-64
  (``VIDUR_A100``), least squares in the batch: 2.03 ms + 172 us a sequence (11 % worst
  over the four). It agrees with vLLM's own profile of 0.5.3 (Llama 3 8B on one H100: "only
  38% of the time was spent on the actual GPU execution", the v0.6.0 blog).
- **V0 with asynchronous output processing (0.6)**: output processing runs while the device
  runs the next step ("performing the processing of the n-th step output while executing
  the n+1-th step", the v0.6.0 blog); the rest stays in step: 1.23 ms + 39.8 us a sequence
  waited for, 0.80 ms + 132 us a sequence beside it (the same profile, split).
- **V1, scheduling in step (0.8-0.13)**: the persistent batch; the gap between two decode
  steps of Llama-2-7B at batch 256 was 5-6 ms (vLLM issue #10634): 21.5 us a sequence.
- **V1 with asynchronous scheduling (current)**: the same work beside the device, 150-170
  us of gap left at batch 256 (vLLM PR #11133): 0.16 ms waited for, 20.9 us a sequence
  beside it. Async scheduling is off in 0.10.2 (``async_scheduling: bool = False``); 0.11.1
  expected it "to be enabled by default in the next release", and 0.14.0 made it the default
  (its release notes: "Async scheduling is now enabled by default", vLLM PR #27614).
"""

from __future__ import annotations

import numpy as np

from costmodel.specs.engines import Engine, register

VIDUR_A100 = {
    "batch": (8, 16, 32, 64),
    "schedule": (0.165, 0.290, 0.519, 0.854),
    "sampler_e2e": (0.879, 0.966, 1.074, 1.320),
    "prepare_inputs_e2e": (0.352, 0.531, 0.807, 1.323),
    "process_model_outputs": (1.587, 2.966, 5.401, 9.062),
    "model_execution_launch": (0.085, 0.122, 0.161, 0.253),
}
"""Vidur's measured vLLM host milliseconds per iteration by batch (means; Llama-2-7B, tp 1,
A100 node; microsoft/vidur ``data/profiling/a100/cpu_overheads.csv`` @0633efa)."""
V1_SYNC_GAP_S, V1_SYNC_BATCH = 5.5e-3, 256
"""The gap between two V1 decode steps with scheduling in step: "about 5-6ms" at bs=256
(vLLM issue #10634, Llama-2-7B)."""
V1_ASYNC_GAP_S = 0.16e-3
"""What asynchronous scheduling leaves of it: "from the original 5-6ms to 150-170us" (vLLM
PR #11133)."""


def _fit(*parts: str) -> tuple[float, float]:
    """(seconds per iteration, seconds per sequence): least squares over Vidur's batches of
    the summed ``parts``."""
    batch = np.asarray(VIDUR_A100["batch"], dtype=float)
    ms = sum(np.asarray(VIDUR_A100[p]) for p in parts)
    fixed, per = np.linalg.lstsq(np.vstack([np.ones_like(batch), batch]).T, ms, rcond=None)[0]
    return float(fixed) * 1e-3, float(per) * 1e-3


_IN_STEP = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "model_execution_launch")
_V05 = _fit(*_IN_STEP, "process_model_outputs")
_V06, _V06_ASYNC = _fit(*_IN_STEP), _fit("process_model_outputs")
_V1_SEQ = V1_SYNC_GAP_S / V1_SYNC_BATCH
_TRITON_BLOCK_MOE = (
    "vllm/model_executor/layers/quantization/fp8.py (vllm-project/vllm PR #29346, 2025-11-24, "
    "'Disable DeepGEMM MoE by default when TP=8 is used'): 'the best performance for DeepSeek "
    "V3 TP=8 on Hopper/Blackwell is with VLLM_MOE_USE_DEEP_GEMM=0 VLLM_USE_DEEP_GEMM=1 i.e. use "
    "DeepGEMM for the GEMM and Triton for the MoE', logging 'Using Triton backend for FP8 MoE'; "
    "without DeepGEMM installed (not in vLLM's wheels: 'follow the setup instructions to "
    "install it', vllm-project/recipes PR #120) every release runs block-scaled fp8 experts in "
    "Triton's fused_moe"
)
_V0_SOURCES = {
    "max_seqs": "vllm/engine/arg_utils.py:63 @v0.5.3.post1: `max_num_seqs: int = 256`",
    "memory_utilization": "vllm/engine/arg_utils.py:61 @v0.5.3.post1: "
    "`gpu_memory_utilization: float = 0.90`",
    "token_budget": "vllm/config.py:802-804 @v0.5.3.post1: `self.max_num_batched_tokens = "
    "max(max_model_len, 2048)` (whole prompts)",
    "fp8_cache_with_fp8_weights": "vllm/worker/cache_engine.py:49-50 @v0.5.3.post1: "
    '`if cache_config.cache_dtype == "auto": self.dtype = model_config.dtype`',
    "block_fp8_moe": _TRITON_BLOCK_MOE,
}
_FA3_ON_HOPPER = (
    "vllm/attention/utils/fa_utils.py (vllm-project/vllm, FlashAttention-3 since PR #12093, "
    "2025-01): `fa_version = 3 if (device_capability.major == 9 and "
    "is_fa_version_supported(3)) else 2`; issue #12429: 'Flash Attention 3 is now supported in "
    "vLLM for Hopper GPUs (SM 9.0)'"
)
_V1_SOURCES = {
    "max_seqs": "vllm/engine/arg_utils.py:1565-1623 @v0.8.5 (_set_default_args_v1, "
    "device_memory >= 70 GiB): `default_max_num_seqs = 1024`",
    "memory_utilization": "vllm/config.py:1308 @v0.8.5: `gpu_memory_utilization: float = 0.9`",
    "token_budget": "vllm/engine/arg_utils.py @v0.8.5 (device_memory >= 70 GiB): "
    "`UsageContext.OPENAI_API_SERVER: 8192`",
    "fp8_cache_with_fp8_weights": "vllm/config/cache.py:52 @v0.10.2: "
    '`cache_dtype: CacheDType = "auto"` (the model\'s dtype)',
    "prefill_attention": _FA3_ON_HOPPER,
    "block_fp8_moe": _TRITON_BLOCK_MOE,
}

V05 = register(Engine(
    name="vllm-0.5", title="vLLM 0.5 (V0)", max_seqs=256, token_budget=2048, whole_prompts=True,
    memory_utilization=0.9, fp8_cache_with_fp8_weights=False,
    step_s=_V05[0], seq_s=_V05[1], block_fp8_moe="triton",
    sources=_V0_SOURCES,
))  # fmt: skip
V06 = register(Engine(
    name="vllm-0.6", title="vLLM 0.6 (V0, asynchronous output processing)", max_seqs=256,
    token_budget=2048, whole_prompts=True, memory_utilization=0.9, fp8_cache_with_fp8_weights=False,
    step_s=_V06[0], seq_s=_V06[1], async_step_s=_V06_ASYNC[0], async_seq_s=_V06_ASYNC[1],
    block_fp8_moe="triton",
    sources={**_V0_SOURCES, "max_seqs": "vllm/engine/arg_utils.py:90 @v0.6.0: "
             "`max_num_seqs: int = 256`"},
))  # fmt: skip
V08 = register(Engine(
    name="vllm-0.8", title="vLLM 0.8-0.13 (V1, scheduling in step)", max_seqs=1024,
    token_budget=8192, memory_utilization=0.9, fp8_cache_with_fp8_weights=False,
    step_s=0.0, seq_s=_V1_SEQ, prefill_attention=("fa3",), block_fp8_moe="triton",
    sources=_V1_SOURCES,
))  # fmt: skip
V1 = register(Engine(
    name="vllm", title="vLLM V1 (asynchronous scheduling)", max_seqs=1024, token_budget=8192,
    memory_utilization=0.9, fp8_cache_with_fp8_weights=False,
    step_s=V1_ASYNC_GAP_S, seq_s=0.0, async_seq_s=_V1_SEQ - V1_ASYNC_GAP_S / V1_SYNC_BATCH,
    batch_overlap_flag="--enable-dbo", prefill_attention=("fa3",),
    block_fp8_moe="triton",
    sources={**_V1_SOURCES, "batch_overlap_flag": "docs/design/dbo.md (vllm-project/vllm, "
             "PR #26024): 'The core motivation of the DBO system in vLLM is to overlap the "
             "sparse all-to-all communication in the MoE layer with the surrounding "
             "computation. This system currently only targets DP+EP deployments.'; "
             "`--enable-dbo` (PR #23693, vLLM 0.11)"},
))  # fmt: skip
