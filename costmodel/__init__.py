"""costmodel: a symbolic cost model of transformer LM training.

Quick start::

    from costmodel import estimate, get_model, TrainSpec
    est = estimate(get_model("cs336-2.7b"), TrainSpec(batch=4, seq=1024))
    est["memory_bytes.peak"], est.expr("flops.forward")

    on8 = estimate(get_model("llama3-8b"), TrainSpec(batch=128, seq=8192, grad_accum=32),
                   ParallelSpec(fsdp=4, cp=2), get_hardware("h100-sxm"))
    on8["time_s.step"], on8["mfu"]
"""

from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.presets import PRESETS, get_model
from costmodel.engine.estimate import Estimate, estimate
from costmodel.engine.quantities import quantities
from costmodel.engine.sweep import sweep
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec

__all__ = [
    "HARDWARE",
    "PRESETS",
    "Estimate",
    "Hardware",
    "ModelSpec",
    "ParallelSpec",
    "SpecError",
    "TrainSpec",
    "estimate",
    "get_hardware",
    "get_model",
    "quantities",
    "sweep",
]
