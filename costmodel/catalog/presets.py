"""Named models, loaded from ``data/models.json`` (sources listed there, under ``_sources``;
what a preset leaves out of the real architecture under ``_notes``)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from costmodel.specs.checks import SpecError
from costmodel.specs.model import ModelSpec


def _load() -> dict[str, Any]:
    text = resources.files("costmodel.catalog").joinpath("data/models.json").read_text()
    return json.loads(text)


_DATA = _load()
PRESETS: dict[str, dict[str, Any]] = {k: v for k, v in _DATA.items() if not k.startswith("_")}
NOTES: dict[str, str] = _DATA["_notes"]
"""Preset -> what it does not model of the real architecture (or how it differs)."""
FP8_BLOCK: frozenset[str] = frozenset(_DATA["_fp8_block"]["models"])
"""Presets whose own fp8 checkpoint scales its weights per 128 x 128 block (the sources are
beside them in ``data/models.json``): ``ServeSpec.fp8_scaling`` ``auto`` is ``block`` for
them."""


def get_model(name: str, **overrides: Any) -> ModelSpec:
    """The preset ``name`` with field overrides, validated (``get_model("gpt2", vocab=50304)``)."""
    if name not in PRESETS:
        raise SpecError("model", f"model must be one of {', '.join(PRESETS)} (got {name!r})")
    return ModelSpec(name=name, **PRESETS[name]).replace(**overrides)
