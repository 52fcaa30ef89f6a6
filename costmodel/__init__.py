"""costmodel: a symbolic cost model of transformer LM training.

Quick start (a notebook; the CLI's names and units, see :mod:`costmodel.api`)::

    import costmodel
    est = costmodel.estimate("llama3-8b", hardware="h100-sxm", gpus=8, seq=8192, batch=64,
                             framework="fsdp2")
    est                                   # model, layout, fit verdict, step time, MFU, peak
    est["time_s.step"], est.expr("time_s.step")       # seconds, and its sympy formula
    est.evaluate(est.expr("time_s.step"))    # the same number, every symbol replaced at once
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

Importing the package loads none of it: each name below is imported on first use (PEP 562),
so ``import costmodel.specs.hardware`` (a distributed rank, a data loader) does not pay for
sympy and the estimator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "costmodel.api": ("Table", "estimate", "from_hf", "max_batch", "max_seq", "min_fsdp",
                      "plan", "serve", "solve", "sweep", "table", "verdict"),
    "costmodel.catalog.hardware": ("HARDWARE", "get_hardware"),
    "costmodel.catalog.presets": ("PRESETS", "get_model"),
    "costmodel.engine.estimate": ("Estimate",),
    "costmodel.engine.plan": ("Plan", "PlanOptions"),
    "costmodel.engine.quantities": ("quantities",),
    "costmodel.specs.checks": ("SpecError",),
    "costmodel.specs.hardware": ("Hardware",),
    "costmodel.specs.model": ("ModelSpec", "TrainSpec"),
    "costmodel.specs.parallel": ("ParallelSpec",),
    "costmodel.symbols": ("symbol",),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
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
    "verdict",
]  # every name of _WHERE (tests/test_api.py holds them equal)


def __getattr__(name: str) -> Any:
    """The public name, imported from its module on first use (then a plain attribute)."""
    try:
        module = _MODULE_OF[name]
    except KeyError:
        raise AttributeError(f"module 'costmodel' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # the names as static tools see them
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
        verdict,
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
