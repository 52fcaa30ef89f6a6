"""One training step as a timeline: compute and communication streams, phase by phase.

Built from an estimate's quantities, in the order the step runs them: forward (compute on
one stream; FSDP/DP/CP/PP communication on another, overlapped under the ``max`` rule or
after the compute under ``sum``; tensor-parallel collectives exposed unless async TP,
expert-parallel all-to-alls unless combined 1F1B, the hand-written FSDP's always),
the pipeline bubble (warm-up and drain, drawn as one idle block), backward, and the
optimizer step (the update's memory traffic, then its communication: ZeRO-1/2's
all-gather). What people otherwise read out of an Nsight Systems trace, predicted.
Units: seconds from the start of the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from costmodel.parallel.exposure import exposed_groups
from costmodel.specs.parallel import ParallelSpec

LANES = ("compute", "communication (overlapped)", "communication (exposed)")
GROUPS = ("fsdp", "cp", "pp", "tp", "ep", "dp")
"""The collective groups in the order the second stream runs them (dp's reduce last: it
waits for the last micro-batch)."""
COLOURS = {"compute": "#4c78a8", "comm": "#f58518", "exposed": "#e45756",
           "bubble": "#bab0ac", "optimizer": "#54a24b", "contention": "#b279a2"}  # fmt: skip
LEGEND = {"compute": "compute", "comm": "overlapped comm", "exposed": "exposed comm",
          "bubble": "pipeline bubble", "optimizer": "optimizer update",
          "contention": "overlap lost to contention"}  # fmt: skip


@dataclass(frozen=True)
class Segment:
    lane: str
    label: str
    kind: str
    """compute, comm, exposed, bubble or optimizer."""
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _overlapped(values: dict[str, Any], group: str, phase: str) -> float:
    """Seconds of a group's phase hidden beside the GEMMs (Megatron's TP backward under
    sequence parallelism: ``costmodel.parallel.timing.overlapped``)."""
    if group != "tp" or phase != "backward":
        return 0.0
    return values.get("comm_overlapped_s.tp", 0.0)


def segments(values: dict[str, Any], par: ParallelSpec) -> list:
    """The step's segments from ``estimate`` values of layout ``par`` on hardware (the
    groups it exposes and its overlap rule as :func:`costmodel.parallel.timing.step_time`
    combines them)."""
    out: list[Segment] = []
    t = 0.0
    overlap, exposed = par.overlap, exposed_groups(par)
    for phase in ("forward", "backward"):
        compute = values[f"time_s.compute_{phase}"]
        out.append(Segment(LANES[0], f"{phase} compute", "compute", t, t + compute))
        c = t if overlap == "max" else t + compute
        for g in GROUPS:
            d = values.get(f"comm_phase_s.{g}.{phase}", 0.0)
            if g in exposed:  # what runs beside the GEMMs, and the share async TP or
                beside = _overlapped(values, g, phase)  # combined 1F1B hides of the rest
                d = beside + (d - beside) * (1 - values[f"comm_exposed_share.{g}"])
            if g == "dp" and overlap == "max":  # beside the last micro-batch only
                c = max(c, t + compute - values[f"time_s.microbatch_{phase}"])
            if d > 0:
                out.append(Segment(LANES[1], f"{g.upper()} {phase}", "comm", c, c + d))
                c += d
        t = max(t + compute, c)
        lost = values.get(f"time_s.contention_{phase}", 0.0)
        if lost > 0:  # overlap below 1 on this device: the overlapped part runs slower
            out.append(Segment(LANES[0], f"{phase} contention", "contention", t, t + lost))
            t += lost
        for g in exposed:
            d = values.get(f"comm_phase_s.{g}.{phase}", 0.0) - _overlapped(values, g, phase)
            d *= values[f"comm_exposed_share.{g}"]
            if d > 0:
                out.append(Segment(LANES[2], f"{g.upper()} {phase}", "exposed", t, t + d))
                t += d
        bubble = values["time_s.bubble"]
        if phase == "forward" and bubble > 0:
            out.append(Segment(LANES[0], "pipeline bubble", "bubble", t, t + bubble))
            t += bubble
    update = values["time_s.optimizer_update"]
    out.append(Segment(LANES[0], "optimizer update", "optimizer", t, t + update))
    t += update
    for g in GROUPS:
        d = values.get(f"comm_phase_s.{g}.optimizer", 0.0)
        if d > 0:
            out.append(Segment(LANES[2], f"{g.upper()} optimizer", "exposed", t, t + d))
            t += d
    return out
