"""Time one dropless MoE layer's routed experts, forward and backward, as frameworks run it.

    python benchmarks/moe_layer.py --out DIR [--quick] [--device auto|cpu|cuda]

The layer of a token-choice top-k MoE (Shazeer et al. 2017; Fedus et al. 2022, Switch): a
bias-free router, a softmax in fp32, the top k experts of each token with their weights
renormalised, the routed copies of each token permuted into expert order, each expert's
SwiGLU FFN (fc1 = gate and up fused, fc2), the outputs scaled by their weights and summed
back onto their tokens. The experts run two ways (``path``):

- ``grouped``: one grouped GEMM per linear reading its offsets on the device (torch's
  ``_grouped_mm``: torchtitan's and NeMo AutoModel's experts; no host sync);
- ``loop``: the token counts read on the host (``.tolist()``, the sync of Megatron-Core's
  dispatcher) and one GEMM per expert and linear launched from it (Megatron-Core's
  ``SequentialMLP``; Transformer Engine's ``GroupedLinear`` over cuBLAS loops alike).

Shapes: each model's d_model, expert width and top-k (config.json), over all its experts
(``ep`` 1) or the share one rank of expert parallelism 8 holds, whose experts receive the
same T·k routed copies on balance; T tokens per micro-batch from 2,048 to 16,384.

Each row: ``model``, ``path``, ``tokens``, ``experts`` (local), ``k``, ``d``, ``f`` and
``seconds`` (one forward and backward, median of ``triton.testing.do_bench`` on a GPU: CUDA
events, so the host's gaps between kernels count, as in a step), ``forward_s``,
``host_s`` (median ``time.perf_counter`` seconds to issue one forward and backward with
the device drained before; a loop's includes waiting at its sync), ``ops`` (ATen ops
dispatched, forward and backward, counted with a dispatch mode) and on a GPU ``kernels``
(device kernels of one forward and backward, ``torch.profiler``). Rows go to
``DIR/moe_layer.jsonl`` as measured; a rerun resumes (``kernel_log.record``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from kernel_log import Case, arguments, host_seconds, record, seconds
from torch.utils._python_dispatch import TorchDispatchMode

MODELS = {  # d_model, d_ff_expert, n_experts, experts_per_token; from each config.json
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "qwen3-235b-a22b": (4096, 1536, 128, 8),
    "deepseek-v3": (7168, 2048, 256, 8),
    "gpt-oss-120b": (2880, 2880, 128, 4),
    "mixtral-8x7b": (4096, 14336, 8, 2),
}
PATHS = ("grouped", "loop")


class Layer:
    """One MoE layer's router and routed experts, bf16 with fp32 routing."""

    def __init__(self, d: int, f: int, experts: int, k: int, path: str, device: torch.device):
        def weight(*shape: int) -> torch.Tensor:
            w = torch.randn(*shape, device=device, dtype=torch.bfloat16) * shape[-1] ** -0.5
            return w.requires_grad_()

        self.k, self.experts, self.path = k, experts, path
        self.router = weight(experts, d)
        if path == "grouped":  # one tensor per linear, all experts stacked
            self.fc1 = weight(experts, 2 * f, d)  # gate and up fused, as Megatron-Core's fc1
            self.fc2 = weight(experts, d, f)
        else:  # one tensor per expert and linear (SequentialMLP's and GroupedLinear's own
            # parameters: indexing a stacked one would add a full-size gradient per expert)
            self.fc1 = [weight(2 * f, d) for _ in range(experts)]
            self.fc2 = [weight(d, f) for _ in range(experts)]

    def parameters(self) -> list[torch.Tensor]:
        """Every weight, for clearing their gradients."""
        stacked = self.path == "grouped"
        return [self.router, *([self.fc1, self.fc2] if stacked else [*self.fc1, *self.fc2])]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the token of each routed copy in expert order, its weight, tokens per expert)."""
        probs = torch.softmax((x @ self.router.T).float(), dim=-1)
        weights, chosen = probs.topk(self.k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        order = chosen.view(-1).argsort(stable=True)
        counts = torch.bincount(chosen.view(-1), minlength=self.experts)
        return order // self.k, weights.view(-1)[order], counts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        token, weight, counts = self.route(x)
        routed = x[token]
        if self.path == "grouped":
            offs = counts.cumsum(0).to(torch.int32)
            gate, up = torch._grouped_mm(routed, self.fc1.transpose(-2, -1), offs=offs).chunk(2, -1)
            y = torch._grouped_mm(F.silu(gate) * up, self.fc2.transpose(-2, -1), offs=offs)
        else:
            parts = routed.split(counts.tolist())  # the host waits for the counts here
            outs = []
            for e, part in enumerate(parts):
                gate, up = (part @ self.fc1[e].T).chunk(2, -1)
                outs.append((F.silu(gate) * up) @ self.fc2[e].T)
            y = torch.cat(outs)
        return torch.zeros_like(x).index_add(0, token, y * weight[:, None])


class OpCount(TorchDispatchMode):
    """Counts the ATen ops dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def shapes(cuda: bool, quick: bool) -> Iterator[tuple[str, int, int, int, int, int]]:
    """(model, d, f, local experts, k, tokens) of each case."""
    if not cuda:  # a CPU checks the harness on narrowed shapes
        yield ("qwen3-30b-a3b", 64, 32, 16, 4, 128)
        yield ("mixtral-8x7b", 64, 128, 8, 2, 128)
        return
    for model, (d, f, experts, k) in MODELS.items():
        for local in (experts, experts // 8) if experts >= 64 else (experts,):
            for tokens in (2048,) if quick else (2048, 8192, 16384):
                yield (model, d, f, local, min(k, local), tokens)


def kernels(call: Callable[[], Any]) -> int:
    """Device kernels one ``call`` launches (``torch.profiler``; GPU only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def measure(path: str, d: int, f: int, experts: int, k: int, tokens: int,
            device: torch.device) -> Callable[[], tuple[dict[str, Any], str]]:  # fmt: skip
    def run() -> tuple[dict[str, Any], str]:
        torch.manual_seed(0)
        layer = Layer(d, f, experts, k, path, device)
        x = torch.randn(tokens, d, device=device, dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn_like(x)

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return layer.forward(x)

        def step() -> None:
            layer.forward(x).backward(grad)
            for w in (x, *layer.parameters()):
                w.grad = None

        step()  # warm: workspaces, the allocator
        with OpCount() as count:
            step()
        row = {"seconds": seconds(step, device), "forward_s": seconds(forward, device),
               "host_s": host_seconds(step, device, repeats=10), "ops": count.ops}  # fmt: skip
        if device.type == "cuda":
            row["kernels"] = kernels(step)
        flops = 3 * 2 * tokens * k * 3 * d * f
        line = (
            f"{row['seconds'] * 1e3:9.3f} ms fwd+bwd, host {row['host_s'] * 1e3:8.3f} ms,"
            f" {row['ops']:5d} ops, {flops / row['seconds'] / 1e12:7.1f} TFLOP/s experts"
        )
        return row, line

    return run


def cases(device: torch.device, quick: bool) -> list[Case]:
    """Every case, as ``kernel_log.record`` measures them."""
    return [(f"{model}/{path}/{experts}x{k}/{tokens}",
             {"model": model, "path": path, "tokens": tokens, "experts": experts, "k": k,
              "d": d, "f": f},
             measure(path, d, f, experts, k, tokens, device))
            for model, d, f, experts, k, tokens in shapes(device.type == "cuda", quick)
            for path in PATHS]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    out, device, quick = arguments(__doc__, argv)
    record(out / "moe_layer.jsonl", cases(device, quick), device)


if __name__ == "__main__":
    main()
