"""Time matmuls over the shapes training and serving run, for costmodel's GEMM pricing.

    python benchmarks/gemm_shapes.py --out DIR [--quick] [--device auto|cpu|cuda]

Kinds (each row: kind, dtype, m, k, n, experts, seconds; FLOPs = 2·m·k·n per expert):

- ``mm``: ``x @ w.T`` in bf16 over rows m from a decode step's 1 to a long micro-batch's
  32,768, depths k from 512 to 16,384 and widths n from 768 to 14,336;
- ``scaled_mm``: fp8 (e4m3) ``torch._scaled_mm`` with tensorwise and rowwise scales, bf16
  out, as torchao's float8 training and Transformer Engine run Hopper's fp8 GEMMs;
- ``grouped_mm`` and ``grouped_mm_dx`` / ``grouped_mm_dw``: torch's ``_grouped_mm`` (the
  expert GEMMs of torchtitan and NeMo AutoModel), forward and the two backward GEMMs, over
  m tokens per expert and the expert shapes of Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3,
  gpt-oss-120b and Mixtral-8x7B (k, n of the gate+up and the down projection);
- ``scaled_grouped_mm``: the same forward in fp8 (e4m3, rowwise scales, bf16 out;
  ``torch._scaled_grouped_mm``, where the build has it);
- ``expert_loop``: the per-expert path of Transformer Engine's ``GroupedLinear`` over cuBLAS
  (Megatron-Core's experts): one bf16 GEMM launched from the host per expert, timed end to
  end, so that small experts show the launches; ``expert_loop_host``: the host's seconds to
  launch that loop without waiting for the device (``time.perf_counter``; per launch, it is
  the ``dispatch_s`` / ``expert_call_s`` the catalog fits, ``costmodel.parallel.host``).
  8 to 256 experts.

Timing on a GPU: ``triton.testing.do_bench`` (CUDA events, L2 flushed before every call,
median); on a CPU: ``validate.probes.calibrate.time_call`` (``kernel_log.py``). Rows go to
``DIR/gemm_shapes.jsonl`` as measured and a rerun skips the keys already there, so an
interrupted or OOM-ended run resumes. A shape the device cannot run (an OOM, a kind the
build lacks) is a row with ``error`` and no time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from kernel_log import Case, arguments, host_seconds, record, seconds

EXPERTS = {  # (gate+up k, n), (down k, n) of one expert; from each model's config.json
    "qwen3-30b-a3b": ((2048, 1536), (768, 2048)),
    "qwen3-235b-a22b": ((4096, 3072), (1536, 4096)),
    "deepseek-v3": ((7168, 4096), (2048, 7168)),
    "gpt-oss-120b": ((2880, 5760), (2880, 2880)),
    "mixtral-8x7b": ((4096, 28672), (14336, 4096)),
}


def shapes(kind: str, cuda: bool, quick: bool) -> Iterator[tuple[int, int, int, int]]:
    """(m, k, n, experts) of each case of ``kind``."""
    if not cuda:  # a CPU checks the harness on small shapes (no fp8 grouped GEMM there)
        if kind == "scaled_grouped_mm":
            return
        for m, k, n in ((64, 256, 512), (256, 512, 256)):
            yield (m, k, n, 4 if kind.startswith(("grouped", "expert")) else 1)
        return
    if kind == "mm":
        rows = (1, 16, 128, 512, 2048, 8192, 32768)
        depths = (512, 768, 1024, 1536, 2048, 2880, 4096, 7168, 8192, 16384)
        widths = (768, 2048, 4096, 14336)
        if quick:
            rows, depths, widths = (16, 2048), (768, 4096), (2048,)
        yield from ((m, k, n, 1) for m in rows for k in depths for n in widths)
    elif kind == "scaled_mm":
        rows, depths, widths = (2048, 8192, 32768), (768, 2048, 4096, 8192), (2048, 4096, 14336)
        yield from ((m, k, n, 1) for m in (rows[:1] if quick else rows) for k in depths
                    for n in widths)  # fmt: skip
    else:
        experts = (8, 32, 128) if kind != "grouped_mm" else (8, 16, 32, 128)
        if kind.startswith(("expert_loop", "scaled_grouped")):
            experts = (8, 32, 64, 256)
        per_expert = (64, 256, 1024, 4096, 16384)
        for pair in EXPERTS.values():
            for k, n in pair:
                for e in experts[:1] if quick else experts:
                    for m in per_expert:
                        if e * m <= 2**18 and e * k * n <= 2**31:  # tokens, weight elements
                            yield (m, k, n, e)


def _fp8(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float8_e4m3fn)


def make_call(kind: str, scaling: str, m: int, k: int, n: int, e: int, device: torch.device
              ) -> Callable[[], Any]:  # fmt: skip
    """A zero-argument call running one case on fresh random operands."""
    bf16 = torch.bfloat16
    if kind == "mm":
        x, w = torch.randn(m, k, device=device, dtype=bf16), torch.randn(n, k, device=device,
                                                                         dtype=bf16)  # fmt: skip
        return lambda: x @ w.T
    if kind == "scaled_mm":
        x, w = _fp8(torch.randn(m, k, device=device)), _fp8(torch.randn(n, k, device=device))
        if scaling == "rowwise":
            sa, sb = torch.ones(m, 1, device=device), torch.ones(1, n, device=device)
        else:
            sa, sb = torch.tensor(1.0, device=device), torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(x, w.T, scale_a=sa, scale_b=sb, out_dtype=bf16)
    offs = torch.arange(m, e * m + 1, m, device=device, dtype=torch.int32)
    x = torch.randn(e * m, k, device=device, dtype=bf16)
    w = torch.randn(e, n, k, device=device, dtype=bf16)
    if kind.startswith("expert_loop"):
        parts = x.split(m)
        return lambda: [p @ w[i].T for i, p in enumerate(parts)]
    if kind == "scaled_grouped_mm":
        xq, wq = _fp8(x), _fp8(w)
        sa = torch.ones(e * m, device=device)
        sb = torch.ones(e, n, device=device)
        return lambda: torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sa, sb, offs=offs,
                                                out_dtype=bf16)  # fmt: skip
    if kind == "grouped_mm":
        return lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    g = torch.randn(e * m, n, device=device, dtype=bf16)
    if kind == "grouped_mm_dx":  # dX = dY W: (e·m, n) x (e, n, k)
        return lambda: torch._grouped_mm(g, w, offs=offs)
    return lambda: torch._grouped_mm(g.T, x, offs=offs)  # dW = dY^T X per expert: (e, n, k)


CASES = (("mm", "bf16"), ("scaled_mm", "tensorwise"), ("scaled_mm", "rowwise"),
         ("grouped_mm", "bf16"), ("grouped_mm_dx", "bf16"), ("grouped_mm_dw", "bf16"),
         ("scaled_grouped_mm", "rowwise"), ("expert_loop", "bf16"),
         ("expert_loop_host", "bf16"))  # fmt: skip


def cases(device: torch.device, quick: bool) -> list[Case]:
    """Every case of every kind, as ``kernel_log.record`` measures them."""

    def measure(kind: str, scaling: str, m: int, k: int, n: int, e: int):
        def run() -> tuple[dict[str, Any], str]:
            call = make_call(kind, scaling, m, k, n, e, device)
            if kind == "expert_loop_host":
                t = host_seconds(call, device)
                return {"seconds": t}, f"{t * 1e6:10.1f} us host, {t / e * 1e6:6.2f} us a launch"
            t = seconds(call, device)
            return {"seconds": t}, f"{t * 1e6:10.1f} us {2 * m * k * n * e / t / 1e12:8.1f} TFLOP/s"

        return run

    return [(f"{kind}/{scaling}/{e}x{m}x{k}x{n}",
             {"kind": kind, "dtype": scaling, "m": m, "k": k, "n": n, "experts": e},
             measure(kind, scaling, m, k, n, e))
            for kind, scaling in CASES
            for m, k, n, e in shapes(kind, device.type == "cuda", quick)]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    out, device, quick = arguments(__doc__, argv)
    record(out / "gemm_shapes.jsonl", cases(device, quick), device)


if __name__ == "__main__":
    main()
