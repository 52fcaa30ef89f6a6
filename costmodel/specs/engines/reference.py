"""The reference model as an engine (``eager``): ``validate/reference/model.py`` served op by
op, as ``python -m validate.run --suite serve`` measures it. Its elementwise work is priced
(``serving.estimate.elementwise_s``) and its kernels' dispatch is the host's
(``serving.estimate.host_s``: ``Hardware.dispatch_s`` per kernel, beside the device's on an
accelerator); no scheduler beyond that. Its defaults are ServeSpec's own: one static batch,
the cache in the weights' dtype."""

from __future__ import annotations

from costmodel.specs.engines import Engine, register

EAGER = register(Engine(
    name="eager",
    title="the reference model, op by op (no serving engine)",
    max_seqs=256,
    token_budget=8192,
    memory_utilization=0.9,
    fp8_cache_with_fp8_weights=False,
    step_s=0.0,
    seq_s=0.0,
    fused=False,
    dispatch_s=3.09e-05,
    sources={"dispatch_s": "the mean of validate.cluster calibrate's host seconds per eager "
             "kernel on two lent GPU nodes' x86 hosts: 29.0 us (H100 SXM5, "
             "validate/measured/h100-sxm-2026-11-26) and 32.8 us (H200, "
             "validate/measured/h200-moe-2026-11-30)",
             "max_seqs": "vLLM's default, for comparison (costmodel.specs.engines.vllm)",
             "token_budget": "vLLM V1's default, for comparison",
             "memory_utilization": "vLLM's default, for comparison"},
))  # fmt: skip
