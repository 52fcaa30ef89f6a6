"""Whether a layout fits its devices: the one fit rule of estimate, solve, plan and the app.

A layout fits when, on each device, both

- its peak allocated bytes (``memory_bytes_per_device.peak``, what
  ``torch.cuda.max_memory_allocated`` reports), and
- its reserved bytes (``memory_bytes_per_device.reserved``: the peak times
  ``Hardware.allocator_reserve``, what ``torch.cuda.max_memory_reserved`` reports: the
  caching allocator's segments, which are what the device really gives away)

are at most ``headroom`` x the device's memory capacity (``Hardware.hbm_bytes``, bytes).
An explicit budget in bytes (``solve --budget-gb``) replaces headroom x capacity.
No other module compares memory with capacity: ``engine.estimate.Estimate.fit``,
``engine.inverse``, ``engine.plan.plan`` and the app's headline call :func:`judge`,
:func:`fits` or :func:`budget_bytes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware

DEFAULT_HEADROOM = 0.9
"""Share of device memory a layout may use. The remaining 10 % is what a run needs
beside the tensors this model counts: the CUDA context and cuBLAS/cuDNN workspaces
(~0.5-1 GiB per process), NCCL's communication buffers (hundreds of MiB per communicator
by default, ``NCCL_BUFFSIZE`` x channels x peers) and allocator fragmentation beyond the
profile's ``allocator_reserve``. Megatron-LM's and torchtitan's users size layouts with a
similar margin; ``memory_headroom`` overrides it everywhere (CLI ``--memory-headroom``)."""

PEAK = "memory_bytes_per_device.peak"
RESERVED = "memory_bytes_per_device.reserved"


def check_headroom(headroom: Any) -> float:
    """``headroom`` as a float in (0, 1], else a SpecError naming ``memory_headroom``."""
    checks.number("memory_headroom", headroom)
    if headroom > 1:
        raise SpecError("memory_headroom", f"memory_headroom must be <= 1 (got {headroom})")
    return float(headroom)


def budget_bytes(
    hardware: Hardware, headroom: float | None = None, budget: float | None = None
) -> float:
    """Bytes a device may use: ``budget`` when given (bytes), else headroom (default
    :data:`DEFAULT_HEADROOM`) x the device's memory capacity."""
    if budget is not None:
        checks.number("budget", budget)
        return float(budget)
    share = DEFAULT_HEADROOM if headroom is None else check_headroom(headroom)
    return share * hardware.hbm_bytes


def fits(values: Mapping[str, Any], budget: float) -> Any:
    """The rule on numbers or numpy arrays: peak and reserved bytes both within ``budget``
    (a bool, or a bool array for a sweep's columns)."""
    ok = (np.asarray(values[PEAK]) <= budget) & (np.asarray(values[RESERVED]) <= budget)
    return bool(ok) if np.ndim(ok) == 0 else ok


@dataclass(frozen=True)
class Fit:
    """The rule's verdict on one configuration; bytes per device."""

    fits: bool
    peak_bytes: float
    reserved_bytes: float
    capacity_bytes: float
    budget_bytes: float
    headroom: float | None
    """Share of capacity allowed; None where an explicit budget was given."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def over(self) -> tuple[str, float]:
        """The quantity furthest over the budget (or closest to it): (name, bytes)."""
        if self.peak_bytes > self.budget_bytes or self.reserved_bytes <= self.budget_bytes:
            return "peak", self.peak_bytes
        return "reserved", self.reserved_bytes

    def capacity(self) -> str:
        """The device's memory as its maker states it: ``80 GiB`` (H100) or ``16 GB``."""
        if self.capacity_bytes % 2**30 == 0:
            return f"{self.capacity_bytes / 2**30:,.0f} GiB"
        return f"{self.capacity_bytes / 1e9:,.0f} GB"

    def allowance(self) -> str:
        """The budget in words: ``72.0 GiB (headroom 0.9 of 80 GiB)``."""
        gib = self.budget_bytes / 2**30
        if self.headroom is None:
            return f"{gib:,.1f} GiB (the budget given; device {self.capacity()})"
        return f"{gib:,.1f} GiB (headroom {self.headroom:g} of {self.capacity()})"

    def sentence(self) -> str:
        """``fits: peak 60.1 GiB, reserved 63.0 GiB <= 72.0 GiB (headroom 0.9 of 80 GB)`` or
        ``does not fit: peak 762.0 GiB > 72.0 GiB (headroom 0.9 of 80 GiB)``."""
        if self.fits:
            return (f"fits: peak {self.peak_bytes / 2**30:,.1f} GiB, reserved "
                    f"{self.reserved_bytes / 2**30:,.1f} GiB <= {self.allowance()}")  # fmt: skip
        name, value = self.over()
        return f"does not fit: {name} {value / 2**30:,.1f} GiB > {self.allowance()}"


def judge(
    values: Mapping[str, Any],
    hardware: Hardware,
    headroom: float | None = None,
    budget: float | None = None,
) -> Fit:
    """The rule on one configuration's quantities (``Estimate.values`` or a plan row)."""
    allowed = budget_bytes(hardware, headroom, budget)
    return Fit(
        fits=fits(values, allowed),
        peak_bytes=float(values[PEAK]),
        reserved_bytes=float(values[RESERVED]),
        capacity_bytes=float(hardware.hbm_bytes),
        budget_bytes=allowed,
        headroom=None if budget is not None else (headroom or DEFAULT_HEADROOM),
    )
