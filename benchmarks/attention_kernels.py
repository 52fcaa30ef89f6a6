"""Time torch's fused attention kernels over sequence length and head dim, both passes.

    python benchmarks/attention_kernels.py --out DIR [--quick] [--device auto|cpu|cuda]

Each row: ``backend`` (torch's SDPA backend: ``flash``, FlashAttention-2; ``cudnn``; on a CPU
``math``), ``causal``, ``seq`` (queries = keys per call), ``head_dim``, ``batch``,
``heads``, ``forward_s``, ``backward_s`` (a forward and backward timed together, less the
forward; each backward makes fresh gradients, as a step's first micro-batch does, rather
than adding into the last call's) and the FLOPs costmodel counts for them
(``costmodel.single.attention``: forward 4·b·h·T²·d over all pairs, half of it causal;
backward 2.5 times the forward). Batch x heads is chosen so that every call holds about
2^22 query-key rows x heads (a full chip at every length). Timing as ``gemm_shapes.py``
(``triton.testing.do_bench`` on a GPU); rows are appended as measured and a rerun skips
the keys already there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from gemm_shapes import seconds
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
    batch = max(1, 2**22 // (t * heads))
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


def run(out: Path, device: torch.device, quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "attention_kernels.jsonl"
    done = {json.loads(line)["key"] for line in path.open()} if path.exists() else set()
    todo = cases(device.type == "cuda", quick)
    with path.open("a") as log:
        for i, (backend, causal, t, d) in enumerate(todo, 1):
            key = f"{backend}/{'causal' if causal else 'full'}/{t}/{d}"
            if key in done:
                continue
            row: dict[str, Any] = {"key": key, "backend": backend, "causal": causal, "seq": t,
                                   "head_dim": d}  # fmt: skip
            try:
                row.update(measure(backend, causal, t, d, device))
                rate = [row[f"{p}_flops"] / row[f"{p}_s"] / 1e12 for p in ("forward", "backward")]
                line = f"forward {rate[0]:7.1f}, backward {rate[1]:7.1f} TFLOP/s"
            except (RuntimeError, NotImplementedError) as err:  # OOM, no such kernel
                row["error"] = str(err).splitlines()[0][:200]
                line = f"error: {row['error']}"
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(f"[{i}/{len(todo)}] {key}: {line}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for attention_kernels.jsonl")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="two lengths per kernel")
    args = parser.parse_args(argv)
    name = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available()
                                                      else "cpu")  # fmt: skip
    if name == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    device = torch.device(name)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    run(Path(args.out), device, args.quick)


if __name__ == "__main__":
    sys.exit(main())
