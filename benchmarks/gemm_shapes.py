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
  gpt-oss-120b and Mixtral-8x7B (k, n of the gate+up and the down projection).

Timing on a GPU: ``triton.testing.do_bench`` (CUDA events, L2 flushed before every call,
median); on a CPU: ``validate.probes.calibrate.time_call``. Rows are appended to
``DIR/gemm_shapes.jsonl`` as measured and a rerun skips the keys already there, so an
interrupted or OOM-ended run resumes. A shape the device cannot run (an OOM, a kind the
build lacks) is a row with ``error`` and no time.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from validate.probes.calibrate import time_call

EXPERTS = {  # (gate+up k, n), (down k, n) of one expert; from each model's config.json
    "qwen3-30b-a3b": ((2048, 1536), (768, 2048)),
    "qwen3-235b-a22b": ((4096, 3072), (1536, 4096)),
    "deepseek-v3": ((7168, 4096), (2048, 7168)),
    "gpt-oss-120b": ((2880, 5760), (2880, 2880)),
    "mixtral-8x7b": ((4096, 28672), (14336, 4096)),
}


def shapes(kind: str, cuda: bool, quick: bool) -> Iterator[tuple[int, int, int, int]]:
    """(m, k, n, experts) of each case of ``kind``."""
    if not cuda:  # a CPU checks the harness on small shapes
        for m, k, n in ((64, 256, 512), (256, 512, 256)):
            yield (m, k, n, 4 if kind.startswith("grouped") else 1)
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
    if kind == "grouped_mm":
        return lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    g = torch.randn(e * m, n, device=device, dtype=bf16)
    if kind == "grouped_mm_dx":  # dX = dY W: (e·m, n) x (e, n, k)
        return lambda: torch._grouped_mm(g, w, offs=offs)
    return lambda: torch._grouped_mm(g.T, x, offs=offs)  # dW = dY^T X per expert: (e, n, k)


def seconds(call: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(call, warmup=10, rep=50, return_mode="median") / 1e3
    return time_call(call, device, 0.05)


CASES = (("mm", "bf16"), ("scaled_mm", "tensorwise"), ("scaled_mm", "rowwise"),
         ("grouped_mm", "bf16"), ("grouped_mm_dx", "bf16"), ("grouped_mm_dw", "bf16"))  # fmt: skip


def run(out: Path, device: torch.device, quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gemm_shapes.jsonl"
    done = {json.loads(line)["key"] for line in path.open()} if path.exists() else set()
    todo = [(kind, scaling, *shape) for kind, scaling in CASES
            for shape in shapes(kind, device.type == "cuda", quick)]  # fmt: skip
    with path.open("a") as log:
        for i, (kind, scaling, m, k, n, e) in enumerate(todo, 1):
            key = f"{kind}/{scaling}/{e}x{m}x{k}x{n}"
            if key in done:
                continue
            row: dict[str, Any] = {"key": key, "kind": kind, "dtype": scaling, "m": m, "k": k,
                                   "n": n, "experts": e}  # fmt: skip
            try:
                row["seconds"] = seconds(make_call(kind, scaling, m, k, n, e, device), device)
                tflops = 2 * m * k * n * e / row["seconds"] / 1e12
                line = f"{row['seconds'] * 1e6:10.1f} us {tflops:8.1f} TFLOP/s"
            except (RuntimeError, NotImplementedError) as err:  # OOM, unsupported kind
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
    parser.add_argument("--out", required=True, help="folder for gemm_shapes.jsonl")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="a few shapes per kind")
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
    main()
