"""Accelerators as data: ``data/hardware.json`` (sources inline) or a measured profile.

``get_hardware("h100-sxm")`` or ``get_hardware("path/to/profile.json")`` (a file written by
``validate.probes.calibrate``, same fields). Units: FLOP/s, bytes, bytes/s, seconds.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from importlib import resources
from pathlib import Path
from typing import Any

from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware


def _catalog() -> dict[str, dict[str, Any]]:
    text = resources.files("costmodel.catalog").joinpath("data/hardware.json").read_text()
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
        raise SpecError("hardware", f"hardware {name}: missing field(s) {', '.join(missing)}")
    return Hardware(name=name, **{k: v for k, v in data.items() if k in known and k != "name"})


def get_hardware(name_or_path: str) -> Hardware:
    """A catalog entry by name, or a JSON profile by path."""
    if not isinstance(name_or_path, str | Path):
        raise SpecError("hardware", "hardware must be a catalog name or a .json path "
                        f"(got {name_or_path!r})")  # fmt: skip
    if name_or_path in HARDWARE:
        return hardware_from_dict(name_or_path, HARDWARE[name_or_path])
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise SpecError("hardware", f"hardware: cannot read {path}: {err}") from err
        if not isinstance(data, dict):
            raise SpecError("hardware", f"hardware: {path} must hold a JSON object")
        return hardware_from_dict(str(data.get("name", path.stem)), data)
    raise SpecError(
        "hardware",
        f"hardware must be one of {', '.join(HARDWARE)} or a .json path (got {name_or_path!r})",
    )
