"""Time torch's fused attention kernels over sequence length and head dim, both passes.

    python benchmarks/attention_kernels.py --out DIR [--quick] [--device auto|cpu|cuda]

Each row: ``backend`` (torch's SDPA backend: ``flash``, FlashAttention-2; ``cudnn``; on a CPU
``math``), ``causal``, ``seq`` (queries = keys per call), ``head_dim``, ``batch``,
``heads``, ``forward_s``, ``backward_s`` (a forward and backward timed together, less the
forward; each backward makes fresh gradients, as a step's first micro-batch does, rather
than adding into the last call's) and the FLOPs costmodel counts for them
(``costmodel.single.attention``: forward 4·b·h·T²·d over all pairs, half of it causal;
backward 2.5 times the forward). Batch x heads is chosen so that every call holds about
2^22 query-key rows x heads (a full chip at every length; 2^14 on a CPU). Timing and the
log: ``kernel_log.py`` (``triton.testing.do_bench`` on a GPU); rows are appended as
measured and a rerun skips the keys already there.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from kernel_log import Case, arguments, record, seconds
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH}  # fmt: skip


def cases(cuda: bool, quick: bool) -> list[tuple[str, bool, int, int]]:
    """(backend, causal, seq, head_dim) of each case."""
    if not cuda:
        return [("math", c, 256, 64) for c in (True, False)]
    seqs = (1024, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384, 32768)
    return [(b, c, t, d) for b in ("flash", "cudnn") for c in (True, False) for d in (64, 128)
            for t in seqs]  # fmt: skip


def flops(causal: bool, b: int, h: int, t: int, d: int) -> tuple[float, float]:
    """(forward, backward) FLOPs as costmodel counts a fused kernel's work."""
    forward = 4.0 * b * h * t * t * d * (0.5 if causal else 1.0)
    return forward, 2.5 * forward


def measure(backend: str, causal: bool, t: int, d: int, device: torch.device) -> dict[str, Any]:
    heads = 2048 // d  # a 2,048-wide model's heads
    rows = 2**22 if device.type == "cuda" else 2**14  # a CPU checks the harness
    batch = max(1, rows // (t * heads))
    shape = (batch, heads, t, d)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))  # fmt: skip
    grad = torch.randn(shape, device=device, dtype=dtype)

    def forward() -> torch.Tensor:
        with sdpa_kernel(BACKENDS[backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def both() -> None:
        for x in (q, k, v):  # fresh gradients: accumulating into old ones adds 3 passes
            x.grad = None
        forward().backward(grad)

    fwd = seconds(forward, device)
    total = seconds(both, device)
    f, b = flops(causal, batch, heads, t, d)
    return {"batch": batch, "heads": heads, "forward_s": fwd, "backward_s": total - fwd,
            "forward_flops": f, "backward_flops": b}  # fmt: skip


def cases_to_record(device: torch.device, quick: bool) -> list[Case]:
    """Every case, as ``kernel_log.record`` measures them."""

    def run(backend: str, causal: bool, t: int, d: int):
        def one() -> tuple[dict[str, Any], str]:
            row = measure(backend, causal, t, d, device)
            rate = [row[f"{p}_flops"] / row[f"{p}_s"] / 1e12 for p in ("forward", "backward")]
            return row, f"forward {rate[0]:7.1f}, backward {rate[1]:7.1f} TFLOP/s"

        return one

    return [(f"{backend}/{'causal' if causal else 'full'}/{t}/{d}",
             {"backend": backend, "causal": causal, "seq": t, "head_dim": d},
             run(backend, causal, t, d))
            for backend, causal, t, d in cases(device.type == "cuda", quick)]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    out, device, quick = arguments(__doc__, argv)
    record(out / "attention_kernels.jsonl", cases_to_record(device, quick), device)


if __name__ == "__main__":
    main()
