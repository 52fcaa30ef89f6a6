"""costmodel: a symbolic cost model of transformer LM training.

Quick start::

    from costmodel import estimate, get_model, TrainSpec
    est = estimate(get_model("cs336-2.7b"), TrainSpec(batch=4, seq=1024))
    est["memory_bytes.peak"], est.expr("flops.forward")

    on8 = estimate(get_model("llama3-8b"), TrainSpec(batch=128, seq=8192, grad_accum=32),
                   ParallelSpec(fsdp=4, cp=2), get_hardware("h100-sxm"))
    on8["time_s.step"], on8["mfu"]
"""

from .estimate import Estimate, estimate, quantities
from .hardware import HARDWARE, Hardware, get_hardware
from .parallel import ParallelSpec
from .presets import PRESETS, get_model
from .specs import ModelSpec, TrainSpec
from .sweep import sweep

__all__ = [
    "HARDWARE",
    "PRESETS",
    "Estimate",
    "Hardware",
    "ModelSpec",
    "ParallelSpec",
    "TrainSpec",
    "estimate",
    "get_hardware",
    "get_model",
    "quantities",
    "sweep",
]
