"""``validate.run --suite serve``: the reference model served with a KV cache
(``validate.reference.decode``) against ``costmodel serve``.

Per case (a preset, cut to a few layers on a CPU; B sequences; a prompt of I tokens):

- ``kv_bytes``: the caches :func:`~validate.reference.decode.allocate` makes for B
  sequences of I + 2 tokens (the prompt and 2 generated) against
  ``memory_bytes_per_device.kv_cache`` (exact);
- ``time_s.prefill``: the forward over the B prompts without a cache (inference mode), the
  head on each prompt's last token, against the prefill's time (TTFT);
- ``time_s.decode_step``: one decode step at position I (the cache holding I tokens)
  against the decode step at I + 1 cached tokens (``output`` 2: the mean of the steps').

Weights and cache in fp32 on a CPU, bf16 on a GPU; timing by
``validate.probes.calibrate.time_call`` (CUDA events on GPUs); predictions on the run's
profile (its host seconds per kernel included, ``costmodel.serving.eager.host_s``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from costmodel import get_model
from costmodel.serving import serve
from costmodel.specs.serving import ServeSpec
from validate.probes.calibrate import time_call
from validate.reference.decode import allocate, cache_bytes, decode_step, full_logits
from validate.reference.model import TransformerLM
from validate.report.results import Row
from validate.suites.runner import Case, Context

SUITE = "serve"


@dataclass(frozen=True)
class ServeCase:
    preset: str
    layers: int | None
    batch: int
    input: int

    @property
    def name(self) -> str:
        depth = f"@L{self.layers}" if self.layers else ""
        return f"{self.preset}{depth}/b{self.batch}/in{self.input}"


def grid(device: torch.device, quick: bool) -> list[ServeCase]:
    if device.type == "cuda":
        cases = [ServeCase("llama3-8b", 4, 8, 1024), ServeCase("llama3-8b", 4, 64, 1024),
                 ServeCase("cs336-large", None, 16, 512),
                 ServeCase("gemma-3-4b", 8, 8, 2048)]  # fmt: skip
        return cases[:2] if quick else cases
    cases = [ServeCase("cs336-small", 4, 1, 256), ServeCase("cs336-small", 4, 8, 256),
             ServeCase("gpt2", 2, 4, 512), ServeCase("llama3-8b", 1, 2, 256)]  # fmt: skip
    return cases[:2] if quick else cases


def run(case: ServeCase, ctx: Context) -> Iterator[Row]:
    base = get_model(case.preset)
    spec = base.replace(n_layers=case.layers) if case.layers else base
    dtype, precision = (torch.bfloat16, "bf16") if ctx.device.type == "cuda" else (
        torch.float32, "fp32")  # fmt: skip
    est = serve(spec, ServeSpec(input=case.input, output=2, batch=case.batch,
                                precision=precision, kv_dtype=precision, engine="eager"),
                ctx.hardware)  # fmt: skip
    config = {"preset": case.preset, "layers": case.layers, "batch": case.batch,
              "input": case.input, "precision": precision}  # fmt: skip

    def row(quantity: str, predicted: float, measured: float, unit: str) -> Row:
        return Row(SUITE, case.name, quantity, predicted, measured, ctx.label, "ok", unit,
                   {"config": config})  # fmt: skip

    torch.manual_seed(0)
    model = TransformerLM(spec, precision=precision, device=ctx.device).eval()
    caches = allocate(model, case.batch, case.input + 2, dtype, device=ctx.device)
    yield row("kv_bytes", est["memory_bytes_per_device.kv_cache"], cache_bytes(caches), "bytes")
    ids = torch.randint(spec.vocab, (case.batch, case.input), device=ctx.device)
    with torch.inference_mode():
        prefill = time_call(lambda: full_logits(model, ids, last=True), ctx.device)
        yield row("time_s.prefill", est["time_s.ttft"], prefill, "s")
        step = ids[:, :1]
        decode = time_call(lambda: decode_step(model, step, caches, case.input), ctx.device)
        yield row("time_s.decode_step", est["time_s.tpot"], decode, "s")


def cases(ctx: Context) -> list[Case]:
    return [Case(SUITE, c.name, lambda ctx, c=c: run(c, ctx)) for c in grid(ctx.device, ctx.quick)]
