"""Inputs of an offload plan: memory budgets, the host<->device link, the search space."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from costmodel.specs import checks

LINKS: dict[str, tuple[float, str]] = {
    "pcie3": (12.6e9, "PCIe 3.0 x16: 15.75 GB/s per direction (PCI-SIG) x 0.8 achieved"),
    "pcie4": (25.2e9, "PCIe 4.0 x16: 31.5 GB/s per direction (PCI-SIG) x 0.8 achieved"),
    "pcie5": (50.4e9, "PCIe 5.0 x16: 63 GB/s per direction (PCI-SIG) x 0.8 achieved"),
    "nvlink-c2c": (360e9, "Grace's NVLink-C2C: 450 GB/s per direction (NVIDIA) x 0.8 achieved"),
}
"""Host<->device links: achieved bytes/s per direction, with the source of the raw rate
(0.8: the link efficiency the hardware profiles use for NVLink)."""

RATES = (1e3, 1e15)
"""The least and the most host<->device, host-memory and NVMe bytes/s taken: a kilobyte a
second (the hardware profiles' least) to a petabyte a second, over 1,000 times the fastest
host link built (GH200's NVLink-C2C, 450 GB/s a direction); past either, a typo or a unit
slip (1e300 GB/s overflowed to an infinite rate, 1e-300 priced 1e300-second steps)."""
MAX_BUDGET = 1e15
"""The most device or host memory a plan may use, in bytes: a petabyte (the largest
shared-memory hosts hold tens of TB)."""

OptimizerState = Literal["host", "nvme"]


@dataclass(frozen=True, kw_only=True)
class OffloadSpec:
    """Budgets, links and the search space of an offload plan (bytes, bytes/s)."""

    device_budget: float
    """Device memory the plan may use."""
    host_budget: float
    """Host memory the plan may use."""
    link_bw: float
    """Achieved host<->device bytes/s per direction (``LINKS``)."""
    overlap: float = 1.0
    """Fraction of the shorter of compute and transfer hidden behind the longer."""
    host_memory_bw: float = 100e9
    """Host DRAM bytes/s the CPU optimizer reaches (a two-socket server's STREAM triad)."""
    optimizer_state: OptimizerState = "host"
    nvme_bw: float = 6e9
    """NVMe bytes/s each way, with ``optimizer_state="nvme"`` (a PCIe 4.0 x4 drive)."""
    loss_chunk: int = 1024
    """Tokens the head and the loss run at a time."""
    chunks: tuple[int, ...] = field(default=())
    """Chunk sizes to try (tokens; empty: T/4 ... 4T in powers of two)."""
    seqs_per_round: tuple[int, ...] = field(default=())
    """Sequences per round to try (empty: the divisors of the batch up to 8)."""

    def __post_init__(self) -> None:
        for name in ("device_budget", "host_budget", "link_bw", "host_memory_bw", "nvme_bw"):
            checks.number(name, getattr(self, name))
        for name in ("device_budget", "host_budget"):
            checks.at_most(
                name, getattr(self, name), f"{MAX_BUDGET:,.0f}", int(MAX_BUDGET), "bytes"
            )
        for name in ("link_bw", "host_memory_bw", "nvme_bw"):
            value = getattr(self, name)
            checks.require(value >= RATES[0], name, lambda n=name, v=value: f"{n} must be >= "
                           f"{RATES[0]:g} bytes/s (got {v:g})")  # fmt: skip
            checks.at_most(name, value, f"{RATES[1]:,.0f}", int(RATES[1]), "bytes/s")
        checks.number("overlap", self.overlap, allow_zero=True)
        checks.at_most("overlap", self.overlap, "1", 1)
        checks.choice("optimizer_state", self.optimizer_state, ("host", "nvme"))
        checks.integer("loss_chunk", self.loss_chunk)
        for name in ("chunks", "seqs_per_round"):
            for v in getattr(self, name):
                checks.integer(name, v)


PLAN_KEYS = ("chunk", "seqs_per_round", "pinned_params", "pinned_grads", "device_units", "full",
             "attn")  # fmt: skip
"""The decisions that name one offload plan (host units not ``full`` or ``attn`` are ``ctx``)."""
