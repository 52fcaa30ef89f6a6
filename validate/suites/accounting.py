"""The accounting suite: exact counts of every preset at full depth on the ``meta`` device.

Parameters (``numel``), forward and backward FLOPs (``FlopCounterMode``), bytes kept for
backward and low-precision weight copies (``validate.probes.accounting.compare``) against
costmodel's formulas; the expected error is exactly zero. Runs on ``meta`` whatever the
device, so 405B models are counted without memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from costmodel.catalog.presets import PRESETS, get_model
from costmodel.specs.model import TrainSpec
from validate.probes.accounting import compare
from validate.report.results import Row
from validate.suites.runner import Case, Context

SUITE = "accounting"


def configurations(quick: bool) -> list[tuple[str, TrainSpec]]:
    """(preset, training) pairs: bf16-mixed flash for all; naive and fp32 too unless quick."""
    trains = [TrainSpec(batch=2, seq=1024, precision="bf16-mixed", attention="flash")]
    if not quick:
        trains += [
            TrainSpec(batch=2, seq=1024, precision="bf16-mixed", attention="naive"),
            TrainSpec(batch=2, seq=1024, precision="fp32", attention="flash"),
        ]
    return list(itertools.product(PRESETS, trains))


def _name(preset: str, train: TrainSpec, quick: bool) -> str:
    model = _model(preset, quick)
    cut = f"/{model.n_layers}-blocks" if model.n_layers != get_model(preset).n_layers else ""
    return f"{preset}/b{train.batch}/t{train.seq}/{train.precision}/{train.attention}{cut}"


QUICK_BLOCKS = 2
"""Under ``--quick`` a preset is counted over its dense leading blocks and this many others,
or one period of its local/global attention pattern where that is longer (Gemma 3's six),
exact all the same: every block of a kind counts alike, so the counts per block are what
is checked. At full depth the meta-device accounting of DeepSeek-V3 took 260 s of a CPU,
Qwen3-30B-A3B 104 s and the dense presets 0.7-5.9 s each (the full suite keeps full
depth)."""


def _model(preset: str, quick: bool) -> Any:
    model = get_model(preset)
    blocks = model.dense_layers + max(QUICK_BLOCKS, model.global_every)
    if quick and blocks < model.n_layers:
        return get_model(preset, n_layers=blocks)
    return model


def run(preset: str, train: TrainSpec, ctx: Context) -> Iterator[Row]:
    name = _name(preset, train, ctx.quick)
    for r in compare(_model(preset, ctx.quick), train, "meta"):
        unit = (
            "params"
            if r["quantity"].startswith("params")
            else ("FLOP" if r["quantity"].startswith("flops") else "bytes")
        )
        yield Row(SUITE, name, r["quantity"], r["predicted"], r["measured"], "meta", "ok", unit)


def cases(ctx: Context) -> list[Case]:
    return [
        Case(SUITE, _name(p, t, ctx.quick), lambda ctx, p=p, t=t: run(p, t, ctx))
        for p, t in configurations(ctx.quick)
    ]
