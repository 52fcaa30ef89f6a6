"""What a plan may vary: the frameworks, recompute policies, micro-batches, interleaving,
tensor-parallel bound, dispatchers, memory headroom and objective of a search, checked."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.engine.fit import DEFAULT_HEADROOM, check_headroom
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.parallel import EP_DISPATCHERS, FRAMEWORKS

FRAMEWORK_CHOICES = tuple(name for name in FRAMEWORKS if trait(name, "planned"))
OBJECTIVES = ("time", "cost", "tokens-per-gpu", "mfu")


@dataclass(frozen=True)
class PlanOptions:
    """What the search may vary; every field is a list of allowed values."""

    frameworks: tuple[str, ...] = ("fsdp2", "megatron")
    recompute: tuple[str, ...] = ("none", "selective", "selective-op", "full")
    micro_batches: tuple[int, ...] | None = None
    """Sequences per device per micro-batch; default every one that divides a replica's share."""
    interleave: tuple[int, ...] = (1, 2)
    max_tp: int | None = None
    """Largest tensor-parallel degree; default the devices of one node (NVLink domain)."""
    memory_headroom: float = DEFAULT_HEADROOM
    """A layout fits when its peak allocated bytes are at most this share of device
    memory (:mod:`costmodel.engine.fit`)."""
    dispatchers: tuple[str, ...] = ("all-to-all",)
    """Expert-parallel token dispatchers to try (``ParallelSpec.ep_dispatcher``; DeepEP's
    and HybridEP's on GPUs only)."""
    objective: str = "time"
    """What ranks the layouts that fit (``OBJECTIVES``): ``time``, the most tokens per
    second (the shortest step at one batch); ``cost``, the fewest device-seconds per token
    (the most tokens per second per device: what a budget's smaller counts may win; on one
    device kind ``tokens-per-gpu`` ranks the same, across kinds cost weighs each kind's
    price: ``costmodel.cli.plan_compare``); ``mfu``,
    the highest model FLOPs utilisation."""

    def __post_init__(self) -> None:
        for name in ("frameworks", "recompute", "micro_batches", "interleave", "dispatchers"):
            if getattr(self, name) is not None:  # lists from callers become tuples (hashable)
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("frameworks", "recompute", "dispatchers"):
            values = getattr(self, name)
            if not values:
                raise SpecError(name, f"{name} must name at least one choice")
        for fw in self.frameworks:
            checks.choice("frameworks", fw, FRAMEWORK_CHOICES)
        for kind in self.dispatchers:
            checks.choice("ep_dispatchers", kind, EP_DISPATCHERS)
        for rc in self.recompute:
            checks.choice("recompute", rc, ("none", "selective", "selective-op", "full"))
        for mb in self.micro_batches or ():
            checks.integer("micro_batches", mb)
        for v in self.interleave:
            checks.integer("interleave", v)
        if self.max_tp is not None:
            checks.integer("max_tp", self.max_tp)
        check_headroom(self.memory_headroom)
        checks.choice("objective", self.objective, OBJECTIVES)
