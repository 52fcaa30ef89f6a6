"""SGLang (0.4 and later): its zero-overhead (overlap) scheduler runs one batch ahead, "the
scheduler runs one batch ahead and prepares all the metadata required for the next batch",
on by default ("It is turned on by default", the SGLang v0.4 blog, lmsys.org 2024-12-04).

Defaults (``SOURCES``, sglang 0.4.0's ``python/sglang/srt/server_args.py``): 8,192 prompt
tokens an iteration (``chunked_prefill_size``, 2,048 on GPUs under 25 GB, not modelled);
``mem_fraction_static`` 0.88 at tp 1, 0.87 at 2, 0.85 at 4, 0.81 at 8, 0.79 at 16; the cache
``auto`` (the model's dtype); as many running requests as half the cache's tokens, at most
its request pool (``min(max(tokens / context_len x 512, 2048), 4096)``): 4,096 here, the
cache binding first in practice.

Prefill attention: FlashAttention-3 on Hopper by default since 0.4.5.post1, for MHA and MLA
models alike (``SOURCES``), FlashInfer's or Triton's kernels elsewhere (the device's
default kernel here).

Block-scaled fp8 experts: Triton's ``fused_moe`` at tp (DeepEP's MoE only under a DeepEP
all-to-all backend).

Host time: every part beside the device (the overlap scheduler), none waited for. SGLang
publishes no per-iteration figure; it is priced as vLLM V1's measured persistent-batch work
(20.9 us a sequence, ``costmodel.specs.engines.vllm``), which Srivatsa et al. 2024 find
SGLang's lower than. An assumption, stated in every answer on it.
"""

from __future__ import annotations

from costmodel.specs.engines import Engine, register
from costmodel.specs.engines.vllm import V1

SGLANG = register(Engine(
    name="sglang", title="SGLang (overlap scheduler)", max_seqs=4096, token_budget=8192,
    memory_utilization=0.88, fp8_cache_with_fp8_weights=False,
    memory_by_tp=((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88)),
    step_s=0.0, seq_s=0.0, async_seq_s=V1.async_seq_s,
    batch_overlap_flag="--enable-two-batch-overlap", prefill_attention=("fa3",),
    block_fp8_moe="triton",
    sources={
        "block_fp8_moe": "python/sglang/srt/layers/moe/ep_moe/layer.py (sgl-project/sglang) "
        "get_moe_impl_class(): DeepEPMoE only under a DeepEP or Mooncake all-to-all backend "
        "(--moe-a2a-backend), the FlashInfer MoEs only on SM100; otherwise FusedMoE, the Triton "
        "fused_moe kernel (sglang/srt/layers/moe/fused_moe_triton)",
        "prefill_attention": "python/sglang/srt/server_args.py (sgl-project/sglang, "
        "0.4.5.post1 on: 'SGLang uses FA3 backend by default since v0.4.5.post1', PR #5571), "
        "attention backend auto-selection: `1.1 We will turn on FA3 on hopper unless user use "
        "spec decode with topk > 1 or page_size > 1.` and for MLA models `2.1 We will use FA3 "
        "backend on hopper.`",
        "batch_overlap_flag": "docs/advanced_features/server_arguments.md (sgl-project/sglang): "
        "`--enable-two-batch-overlap` [bool, default=False] — Enabling two micro batches to "
        "overlap (LMSYS, 'Deploying DeepSeek with PD Disaggregation and Large-scale Expert "
        "Parallelism on 96 H100 GPUs', 2025-05-05: two-batch overlap)",
        "max_seqs": "python/sglang/srt/model_executor/model_runner.py:505-514 @v0.4.0: "
        "`max_num_reqs = min(max(int(self.max_total_num_tokens / "
        "self.model_config.context_len * 512), 2048), 4096)`",
        "token_budget": "python/sglang/srt/server_args.py:171-175 @v0.4.0: "
        "`self.chunked_prefill_size = 8192`",
        "memory_utilization": "python/sglang/srt/server_args.py:158-168 @v0.4.0: "
        "`else: self.mem_fraction_static = 0.88`",
        "memory_by_tp": "python/sglang/srt/server_args.py:158-168 @v0.4.0: `if self.tp_size "
        ">= 16: 0.79; >= 8: 0.81; >= 4: 0.85; >= 2: 0.87; else 0.88`",
        "fp8_cache_with_fp8_weights": "python/sglang/srt/server_args.py:46 @v0.4.0: "
        '`kv_cache_dtype: str = "auto"`',
    },
))  # fmt: skip
