"""Named models, loaded from ``data/models.json`` (sources listed there)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from costmodel.specs.model import ModelSpec


def _load() -> dict[str, dict[str, Any]]:
    text = resources.files("costmodel.catalog").joinpath("data/models.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


PRESETS: dict[str, dict[str, Any]] = _load()


def get_model(name: str, **overrides: Any) -> ModelSpec:
    """The preset ``name`` with field overrides, validated (``get_model("gpt2", vocab=50304)``)."""
    if name not in PRESETS:
        raise ValueError(f"model must be one of {', '.join(PRESETS)} (got {name!r})")
    return ModelSpec(name=name, **PRESETS[name]).replace(**overrides)
