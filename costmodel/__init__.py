"""costmodel: a symbolic cost model of transformer LM training.

Quick start (a notebook; the CLI's names and units, see :mod:`costmodel.api`)::

    import costmodel
    est = costmodel.estimate("llama3-8b", hardware="h100-sxm", gpus=8, seq=8192, batch=64,
                             framework="fsdp2")
    est                                   # model, layout, fit verdict, step time, MFU, peak
    est["time_s.step"], est.expr("time_s.step")       # seconds, and its sympy formula
    est.expr("time_s.step").subs(est.symbol_values())  # the same number, by substitution
    costmodel.sweep("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=[2048, 4096])
    costmodel.max_seq("llama3-8b", hardware="h100-sxm", gpus=8, batch=8, framework="fsdp2")
    costmodel.plan("llama3-8b", hardware="h100-sxm", gpus=8, batch=64, seq=8192).table()
    costmodel.serve("llama3-70b", hardware="h100-sxm", tp=4, input=2000, output=500, batch=32)

Symbols: ``from costmodel.symbols import T, D`` or ``costmodel.symbol("T")``, never
``sympy.Symbol("T")`` (the package's carry assumptions; see :mod:`costmodel.symbols`).
Specs work too, priced exactly as given: ``estimate(get_model("cs336-2.7b"),
TrainSpec(batch=4, seq=1024))`` runs the whole batch as one micro-batch (``grad_accum`` 1,
the spec's default), with no framework defaults and no notes; by name, as the CLI, a
micro-batch of 1 per device and the defaults apply (``est.notes`` says which).
"""

from costmodel.api import (
    Table,
    estimate,
    from_hf,
    max_batch,
    max_seq,
    min_fsdp,
    plan,
    serve,
    solve,
    sweep,
    table,
)
from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.presets import PRESETS, get_model
from costmodel.engine.estimate import Estimate
from costmodel.engine.plan import Plan, PlanOptions
from costmodel.engine.quantities import quantities
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols import symbol

__all__ = [
    "HARDWARE",
    "PRESETS",
    "Estimate",
    "Hardware",
    "ModelSpec",
    "ParallelSpec",
    "Plan",
    "PlanOptions",
    "SpecError",
    "Table",
    "TrainSpec",
    "estimate",
    "from_hf",
    "get_hardware",
    "get_model",
    "max_batch",
    "max_seq",
    "min_fsdp",
    "plan",
    "quantities",
    "serve",
    "solve",
    "sweep",
    "symbol",
    "table",
]
