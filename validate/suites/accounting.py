"""The accounting suite: exact counts of every preset at full depth on the ``meta`` device.

Parameters (``numel``), forward and backward FLOPs (``FlopCounterMode``), bytes kept for
backward and low-precision weight copies (``validate.probes.accounting.compare``) against
costmodel's formulas; the expected error is exactly zero. Runs on ``meta`` whatever the
device, so 405B models are counted without memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

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


def _name(preset: str, train: TrainSpec) -> str:
    return f"{preset}/b{train.batch}/t{train.seq}/{train.precision}/{train.attention}"


def run(preset: str, train: TrainSpec, ctx: Context) -> Iterator[Row]:
    name = _name(preset, train)
    for r in compare(get_model(preset), train, "meta"):
        unit = (
            "params"
            if r["quantity"].startswith("params")
            else ("FLOP" if r["quantity"].startswith("flops") else "bytes")
        )
        yield Row(SUITE, name, r["quantity"], r["predicted"], r["measured"], "meta", "ok", unit)


def cases(ctx: Context) -> list[Case]:
    return [
        Case(SUITE, _name(p, t), lambda ctx, p=p, t=t: run(p, t, ctx))
        for p, t in configurations(ctx.quick)
    ]
