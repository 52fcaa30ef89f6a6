"""Accelerators as data: ``data/hardware.json`` (sources inline) or a measured profile.

``get_hardware("h100-sxm")`` or ``get_hardware("path/to/profile.json")`` (a file written by
``validate.calibrate``, same fields). Units: FLOP/s, bytes, bytes/s, seconds.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
EFFICIENCY_KEYS = ("matmul", "attention", "hbm", "link", "network")


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One device and how it connects to the others."""

    name: str
    kind: str
    """``gpu``, ``tpu`` or ``cpu``."""
    peak_flops: dict[str, float | None]
    """Dense peak FLOP/s by dtype; None where the device has no such unit."""
    hbm_bytes: float
    """Device memory capacity."""
    hbm_bw: float
    """Device memory bandwidth."""
    link_bw: float
    """One-way bandwidth per device inside a node (NVLink) or per ICI link (TPU)."""
    link_bw_bidir: float
    """Both directions of the same link."""
    links_per_axis: int
    """ICI links per mesh axis (2 on a torus: both neighbours); 1 for switched GPUs."""
    devices_per_node: int
    """Devices reachable over ``link_bw`` (one NVLink domain or TPU host)."""
    network_bw: float
    """One-way inter-node bandwidth per device (InfiniBand / DCN share)."""
    link_latency_s: float
    """alpha: per-step latency of a collective inside a node."""
    network_latency_s: float
    """alpha across nodes."""
    efficiency: dict[str, float] = field(default_factory=dict)
    """Achievable fractions: matmul and attention (of peak FLOP/s), hbm, link, network."""
    attention_flops: dict[str, float] = field(default_factory=dict)
    """Measured fused-attention FLOP/s by dtype (causal work); overrides
    ``efficiency.attention`` for that dtype (a CPU's bf16 attention need not scale with
    its bf16 matmuls)."""
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("hbm_bytes", "hbm_bw", "link_bw", "link_bw_bidir", "network_bw"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"hardware {self.name}: {name} must be > 0 (got {value!r})")
        unknown = set(self.peak_flops) - set(DTYPES)
        if unknown:
            raise ValueError(f"hardware {self.name}: unknown peak_flops dtype(s) {sorted(unknown)}")
        for key in EFFICIENCY_KEYS:
            value = self.efficiency.get(key, 1.0)
            if not 0 < value <= 1:
                raise ValueError(f"hardware {self.name}: efficiency.{key} must be in (0, 1]")

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a precision's matmul dtype, with a clear error if unsupported."""
        value = self.peak_flops.get(dtype)
        if not value:
            have = ", ".join(k for k, v in self.peak_flops.items() if v)
            raise ValueError(f"hardware {self.name} has no {dtype} peak (has {have})")
        return float(value)

    def attention_peak(self, dtype: str) -> float:
        """Achievable fused-attention FLOP/s in ``dtype``."""
        if self.attention_flops.get(dtype):
            return float(self.attention_flops[dtype])
        return self.peak(dtype) * self.efficiency.get("attention", self.eff("matmul"))

    def eff(self, key: str) -> float:
        return float(self.efficiency.get(key, 1.0))


def _catalog() -> dict[str, dict[str, Any]]:
    text = resources.files("costmodel").joinpath("data/hardware.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


HARDWARE: dict[str, dict[str, Any]] = _catalog()


def hardware_from_dict(name: str, data: dict[str, Any]) -> Hardware:
    known = {f.name for f in fields(Hardware)}
    required = [
        f.name
        for f in fields(Hardware)
        if f.name != "name" and f.default is MISSING and f.default_factory is MISSING
    ]
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"hardware {name}: missing field(s) {', '.join(missing)}")
    return Hardware(name=name, **{k: v for k, v in data.items() if k in known and k != "name"})


def get_hardware(name_or_path: str) -> Hardware:
    """A catalog entry by name, or a JSON profile by path."""
    if name_or_path in HARDWARE:
        return hardware_from_dict(name_or_path, HARDWARE[name_or_path])
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"hardware: cannot read {path}: {err}") from err
        return hardware_from_dict(data.get("name", path.stem), data)
    raise ValueError(
        f"hardware must be one of {', '.join(HARDWARE)} or a .json path (got {name_or_path!r})"
    )
