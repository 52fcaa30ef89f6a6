"""Whether a layout fits its devices: the one fit rule of estimate, solve, plan and the app.

A layout fits when, on each device, its peak allocated bytes
(``memory_bytes_per_device.peak``, what ``torch.cuda.max_memory_allocated`` reports) are at
most ``headroom`` x the device's memory capacity (``Hardware.hbm_bytes``). An explicit
budget in bytes (``solve --budget-gb``) replaces headroom x capacity.

The reserved bytes (``memory_bytes_per_device.reserved``: the peak times
``Hardware.allocator_reserve``, what ``torch.cuda.max_memory_reserved`` reports with room to
spare) are judged against the same budget and said when over it, but do not veto a fit:
PyTorch's caching allocator frees its cached blocks and retries when ``cudaMalloc`` fails,
so a run whose unconstrained reserve exceeds the device still runs, with extra
synchronising frees (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` avoids most).
The published runs say so: of the 66 of ``validate/published/data/runs.json``, all of which
ran, every one has its predicted peak within 0.9 of its device (at most 0.872), while 12
predict a reserve above 0.9 and 5 above the whole device (MosaicML's MPT 7B-30B on
8 x 80 GB, 1.03-1.05), so a rule vetoing on the reserve would call 12 real runs impossible
(``tests/test_verdict.py`` checks every run fits).

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
"""Share of device memory a layout's peak may use. The remaining 10 % is what a run needs
beside the tensors this model counts: the CUDA context and cuBLAS/cuDNN workspaces
(~0.5-1 GiB per process), NCCL's communication buffers (hundreds of MiB per communicator
by default, ``NCCL_BUFFSIZE`` x channels x peers) and the allocator's fragmentation at its
peak (torchtitan's published runs reserve up to 88 % of their 96 GiB H100s). It is the
margin the planner always used; ``memory_headroom`` overrides it everywhere (CLI
``--memory-headroom``)."""

PEAK = "memory_bytes_per_device.peak"
RESERVED = "memory_bytes_per_device.reserved"
MEMORY_PARTS = ("frozen", "params", "master", "grads", "optimizer", "buffers", "activations")
"""The per-device memory components (``memory_bytes_per_device.*``) a table lists."""


def rest_at_peak(values: Mapping[str, Any]) -> float:
    """Bytes of the peak beyond :data:`MEMORY_PARTS` (logits, gathered layers, a gradient's
    cast, ...), negative where those parts are not all alive at once: what a table adds so
    that its lines sum to the peak."""
    listed = sum(float(values.get(f"memory_bytes_per_device.{k}") or 0) for k in MEMORY_PARTS)
    return float(values[PEAK]) - listed


def peak_at(values: Mapping[str, Any]) -> str | None:
    """Where a step's peak falls: ``the optimizer step`` where it is above the forward's
    and the backward's with the optimizer state held beside them (``costmodel.single.
    memory.peak_memory``: the step's gradients and the optimizer's temporaries beside the
    state, no activations), else ``the forward and backward``; None where the phases' peaks
    are not priced."""
    keys = ("memory_bytes_per_device.peak_forward_backward", "memory_bytes_per_device.optimizer")
    both, state = (values.get(k) for k in keys)
    if PEAK not in values or both is None or state is None:
        return None
    step = float(values[PEAK]) > (float(both) + float(state)) * (1 + 1e-9)
    return "the optimizer step" if step else "the forward and backward"


def check_headroom(headroom: Any) -> float:
    """``headroom`` as a float in (0, 1], else a SpecError naming ``memory_headroom``."""
    checks.number("memory_headroom", headroom)
    if headroom > 1:
        raise SpecError("memory_headroom", f"memory_headroom must be <= 1 (got {headroom})")
    return float(headroom)


def budget_bytes(
    hardware: Hardware, headroom: float | None = None, budget: float | None = None
) -> float:
    """Bytes a device may use: ``budget`` when given (bytes; at most the device's memory:
    a peak over it does not fit the device, whatever the budget), else headroom (default
    :data:`DEFAULT_HEADROOM`) x the device's memory capacity."""
    if budget is not None:
        checks.number("budget", budget)
        if budget > hardware.hbm_bytes:
            raise SpecError("budget", f"budget must be <= {hardware.name}'s memory, "
                            f"{hardware.hbm_bytes / 1e9:.6g} GB (got {budget / 1e9:.6g} GB): "
                            "a peak over the device's memory does not fit it")  # fmt: skip
        return float(budget)
    share = DEFAULT_HEADROOM if headroom is None else check_headroom(headroom)
    return share * hardware.hbm_bytes


def fits(values: Mapping[str, Any], budget: float) -> Any:
    """The rule on numbers or numpy arrays: the peak within ``budget`` bytes (a bool, or a
    bool array for a sweep's columns)."""
    ok = np.asarray(values[PEAK]) <= budget
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

    @property
    def tight(self) -> bool:
        """The peak fits and the allocator's reserve does not fit the device: ``fits, but
        TIGHT`` in every reader."""
        return self.fits and self.reserved_bytes > self.capacity_bytes

    @property
    def reserved_over_budget(self) -> bool:
        """The allocator's reserve, unconstrained, would pass the budget (said, no veto)."""
        return self.reserved_bytes > self.budget_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reserved_over_budget": self.reserved_over_budget,
                "tight": self.tight}  # fmt: skip

    def capacity(self) -> str:
        """The device's memory in GiB, as the peak and budget beside it: ``80 GiB`` (an
        H100's, whole), ``23.3 GiB`` (a machine's measured memory, not whole)."""
        gib = self.capacity_bytes / 2**30
        return f"{gib:,.0f} GiB" if self.capacity_bytes % 2**30 == 0 else f"{gib:,.1f} GiB"

    def allowance(self, digits: int = 1) -> str:
        """The budget in words: ``72.0 GiB (headroom 0.9 of 80 GiB)``."""
        gib = self.budget_bytes / 2**30
        if self.headroom is None:
            return f"{gib:,.{digits}f} GiB (the budget given; device {self.capacity()})"
        return f"{gib:,.{digits}f} GiB (headroom {self.headroom:g} of {self.capacity()})"

    def reserve_warning(self) -> str | None:
        """What a reserve over the budget means, or None where it is within."""
        if not self.reserved_over_budget:
            return None
        return (f"reserved {self.reserved_bytes / 2**30:,.1f} GiB is over the budget: it "
                "takes the margin the headroom keeps (the CUDA context, NCCL's buffers), and "
                "where the device runs short the caching allocator frees cached blocks and "
                "retries (slower steps; expandable_segments helps)")  # fmt: skip

    def sentence(self, warn: bool = True) -> str:
        """``fits: peak 31.9 GiB <= 72.0 GiB (headroom 0.9 of 80 GiB); reserved 38.3 GiB``,
        a reserve over the budget said as such (``warn``; over the device's memory: ``fits,
        but TIGHT``, the peak fits and the allocator's cache cannot), or ``does not fit:
        peak 761.9 GiB > ...``; with the digits that tell the peak from the budget
        (``21.63 GiB > 21.60 GiB``)."""
        peak, reserved = self.peak_bytes / 2**30, self.reserved_bytes / 2**30
        digits = _telling_digits(peak, self.budget_bytes / 2**30)
        if not self.fits:
            return f"does not fit: peak {peak:,.{digits}f} GiB > {self.allowance(digits)}"
        tight = self.tight
        head = (
            "fits, but TIGHT"
            if warn and tight
            else "fits, with little margin"
            if warn and self.reserved_over_budget
            else "fits"
        )  # the app's words too
        said = (f"{head}: peak {peak:,.{digits}f} GiB <= {self.allowance(digits)}; reserved "
                f"{reserved:,.1f} GiB")  # fmt: skip
        if warn and tight:
            cap = self.capacity()
            if not cap.endswith("GiB"):
                cap += f" ({self.capacity_bytes / 2**30:,.1f} GiB)"
            said += (f" is over the device's {cap}: the allocator cannot hold that "
                     "much, so expect retries that free cached blocks and a risk of running out "
                     "(expandable_segments helps; less memory a device is safer: a smaller "
                     "micro-batch, more sharding or recomputation)")  # fmt: skip
        elif warn and self.reserved_over_budget:
            said += (" is over it, within the device's memory: it takes the margin the "
                     "headroom keeps, and where the device runs short the caching allocator "
                     "frees cached blocks and retries (slower steps)")  # fmt: skip
        return said


def _telling_digits(a: float, b: float, most: int = 4) -> int:
    """Decimals (1 to ``most``) at which ``a`` and ``b`` print differently, if any do."""
    for digits in range(1, most + 1):
        if f"{a:.{digits}f}" != f"{b:.{digits}f}":
            return digits
    return 1


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


def budget_from(
    budget_gb: float | None, budget_gib: float | None, headroom: float | None = None
) -> float | None:
    """Bytes of a budget given in GB (1e9 bytes) or GiB (2^30), one of them (``solve
    --budget-gb``, the API's ``budget_gb``); None where neither is given. A figure above
    a million is refused as bytes given where GB were meant, and a ``headroom`` beside a
    budget (it makes a budget of the device's memory: one would be dropped)."""
    if budget_gb is not None and budget_gib is not None:
        raise SpecError("budget_gb", "give budget_gb or budget_gib, not both")
    if headroom is not None and (budget_gb is not None or budget_gib is not None):
        raise SpecError("memory_headroom", "memory_headroom makes the budget a share of the "
                        "device's memory; budget_gb / budget_gib give it outright: give one "
                        "of them")  # fmt: skip
    for name, value, unit, said in (("budget_gb", budget_gb, 1e9, "GB"),
                                    ("budget_gib", budget_gib, 2**30, "GiB")):  # fmt: skip
        if value is not None:
            checks.number(name, value)
            if value > 1e6:
                raise SpecError(name, f"{name} is in {said}, not bytes (got {value:g})")
            return value * unit
    return None
