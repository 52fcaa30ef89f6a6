"""costmodel: a symbolic cost model of transformer LM training.

Quick start::

    from costmodel import estimate, get_model, TrainSpec
    est = estimate(get_model("cs336-2.7b"), TrainSpec(batch=4, seq=1024))
    est["memory_bytes.peak"], est.expr("flops.forward")
"""

from .estimate import Estimate, estimate, quantities
from .presets import PRESETS, get_model
from .specs import ModelSpec, TrainSpec
from .sweep import sweep

__all__ = [
    "PRESETS",
    "Estimate",
    "ModelSpec",
    "TrainSpec",
    "estimate",
    "get_model",
    "quantities",
    "sweep",
]
