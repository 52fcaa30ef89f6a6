"""TensorRT-LLM (``trtllm-serve``, ``trtllm-bench``; the PyTorch backend from 0.19 and the
C++ executor before): in-flight batching with the overlap scheduler on by default ("At step
n, the system launches GPU computation for step n+1 without waiting for CPU tasks ... from
step n to complete", TensorRT-LLM's overlap scheduler page).

Defaults (``SOURCES``): 2,048 sequences (``max_batch_size``) and 8,192 tokens an iteration
(``max_num_tokens``); the cache takes 0.9 of the memory free after the weights
(``free_gpu_memory_fraction``; priced here as 0.9 of the device, as for the other engines);
an fp8 checkpoint is served with an fp8 cache ("If you specify FP8 quantization, the KV
cache will automatically be set to FP8 as well", the v0.17 perf overview).

Prefill attention: its context FMHA, on Hopper kernels built as FlashAttention-3 is (TMA
loads and warp specialization, Shah et al. 2024 Sec. 3.1; ``SOURCES``), priced at
FlashAttention-3's measured rate: an assumption, since TensorRT-LLM publishes no rate of its
own; elsewhere the device's default kernel.

Host time: a C++ runtime with the overlap scheduler; no per-iteration figure is published,
and none is priced (0: the device's time is the iteration's).
"""

from __future__ import annotations

from costmodel.specs.engines import Engine, register

TRTLLM = register(Engine(
    name="trtllm", title="TensorRT-LLM (overlap scheduler)", max_seqs=2048, token_budget=8192,
    memory_utilization=0.9, fp8_cache_with_fp8_weights=True, step_s=0.0, seq_s=0.0,
    prefill_attention=("fa3",),
    sources={
        "prefill_attention": "cpp/tensorrt_llm/kernels/contextFusedMultiHeadAttention "
        "(NVIDIA/TensorRT-LLM): the Hopper context kernels, e.g. "
        "`fmha_v2_flash_attention_bf16_64_128_S_qkv_128_causal_tma_ws_sm90_kernel` (tma_ws: "
        "TMA and warp-specialized, FA3's design; docs/source/advanced/gpt-attention.md: 'For "
        "larger sequences, this kernel uses the Flash Attention algorithm')",
        "max_seqs": "docs/source/performance/tuning-max-batch-size-and-max-num-tokens.md "
        "@16d2467: `The default value is 2048.`",
        "token_budget": "docs/source/performance/tuning-max-batch-size-and-max-num-tokens.md "
        "@16d2467: `The default value of max num tokens is is 8192.`",
        "memory_utilization": "tensorrt_llm/commands/serve.py @00209af: "
        "`--kv_cache_free_gpu_memory_fraction, type=float, default=0.9`",
        "fp8_cache_with_fp8_weights": "docs/source/performance/perf-overview.md @v0.17: `If you "
        "specify FP8 quantization, the KV cache will automatically be set to FP8 as well`",
    },
))  # fmt: skip
