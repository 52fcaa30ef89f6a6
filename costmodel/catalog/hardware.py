"""Accelerators as data: ``data/hardware.json`` (sources inline) or a measured profile.

``get_hardware("h100-sxm")`` or ``get_hardware("path/to/profile.json")`` (a file written by
``validate.probes.calibrate``, same fields). Units: FLOP/s, bytes, bytes/s, seconds.
``resolve_device("H100 SXM5 96GB")`` names the catalog entry a device written as a source
writes it is (each entry's ``aliases``; the rules in the catalog's ``_aliases`` note).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import MISSING, fields
from importlib import resources
from pathlib import Path
from typing import Any

from costmodel.catalog.files import read_json
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware


def _catalog() -> dict[str, dict[str, Any]]:
    text = resources.files("costmodel.catalog").joinpath("data/hardware.json").read_text()
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


HARDWARE: dict[str, dict[str, Any]] = _catalog()


PROFILE_DATA = frozenset(("aliases", "measured", "provenance"))
"""Keys a profile holds beside the fields: the catalog's other names for a device, and a
calibrated profile's measurements and where they came from (``validate.cluster``)."""


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
    unknown = sorted(k for k in data if k not in known | PROFILE_DATA and k[:1] != "_")
    if unknown:  # a misspelt field would silently keep its default (allocator_reserv)
        raise SpecError("hardware", f"hardware {name}: unknown field(s) {', '.join(unknown)} "
                        f"(fields: {', '.join(sorted(known - {'name'}))}; a note's key "
                        "starts with _)")  # fmt: skip
    return Hardware(name=name, **{k: v for k, v in data.items() if k in known and k != "name"})


def get_hardware(name_or_path: str) -> Hardware:
    """A catalog entry by name, a JSON profile by path, or a profile already built (a
    ``Hardware``, e.g. one with its efficiencies changed: taken as it is)."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    if not isinstance(name_or_path, str | Path):
        given = type(name_or_path).__name__
        raise SpecError("hardware", "hardware must be a catalog name, a .json path or a "
                        f"Hardware (got a value of type {given})")  # fmt: skip
    if not str(name_or_path).strip():
        raise SpecError("hardware", "hardware must be a catalog name or a .json path (got '')")
    if name_or_path in HARDWARE:
        return hardware_from_dict(name_or_path, HARDWARE[name_or_path])
    path = Path(name_or_path)
    try:
        is_path = path.suffix == ".json" or path.exists()
    except (OSError, ValueError):  # a name too long for a path, a NUL byte
        is_path = False
    if is_path:
        data = read_json(path, "hardware")
        if not isinstance(data, dict):
            raise SpecError("hardware", f"hardware: {path} must hold a JSON object")
        return hardware_from_dict(str(data.get("name", path.stem)), data)
    name = str(name_or_path).lower()
    close = [k for k in HARDWARE if name in k] or difflib.get_close_matches(name, HARDWARE, n=3)
    said = f"; did you mean {' or '.join(close)}?" if close else ""
    raise SpecError(
        "hardware",
        f"hardware must be one of {', '.join(HARDWARE)} or a .json path (got "
        f"{name_or_path!r}){said}",
    )


IGNORED_WORDS = frozenset({
    "nvidia", "amd", "google", "tesla", "instinct", "geforce", "sxm", "sxm2", "sxm4", "sxm5",
    "hbm2", "hbm2e", "hbm3", "hbm3e", "dgx", "hgx", "gpu", "gpus",
})  # fmt: skip
"""Vendor, form-factor and system words that do not tell two catalog devices apart."""


PROFILES_ENV = "COSTMODEL_PROFILES"
"""A folder of measured hardware profiles (``python -m validate.cluster calibrate`` writes
``cluster-profile.json``) that the app offers beside the catalog."""


def device_choices() -> tuple[str, ...]:
    """The catalog's devices, then the path of every ``*profile*.json`` regular file in
    ``$COSTMODEL_PROFILES`` (unset or unreadable: none), each a valid ``hardware``."""
    folder = os.environ.get(PROFILES_ENV, "").strip()
    try:
        found = sorted(str(p) for p in Path(folder).glob("*profile*.json") if p.is_file())
    except OSError:
        found = []
    return (*HARDWARE, *(found if folder else ()))


def device_words(text: str) -> frozenset[str]:
    """The words that name a device in ``text``: lower case, parenthesised notes and what
    follows a comma or semicolon dropped, memory sizes joined ("80 GB" -> "80gb"), split
    at punctuation, :data:`IGNORED_WORDS` and counts ("8x") left out."""
    text = text.lower()
    while re.search(r"\([^()]*\)|\[[^\[\]]*\]", text):
        text = re.sub(r"\([^()]*\)|\[[^\[\]]*\]", " ", text)
    text = re.split(r"[,;]", text, maxsplit=1)[0]
    text = re.sub(r"(\d+)\s*gi?b\b", r"\1gb", text)
    words = re.split(r"[^a-z0-9]+", text)
    return frozenset(
        w for w in words if w and w not in IGNORED_WORDS and not re.fullmatch(r"\d+x", w)
    )


def _alias_table() -> dict[frozenset[str], str]:
    """Words -> catalog name, from every entry's name and ``aliases``; two entries that
    claim the same words are an error in the catalog, caught here."""
    table: dict[frozenset[str], str] = {}
    for name, entry in HARDWARE.items():
        for text in (name, *entry.get("aliases", ())):
            words = device_words(text)
            if table.setdefault(words, name) != name:
                raise ValueError(
                    f"hardware.json: alias {text!r} of {name} is also {table[words]}'s"
                )
    return table


ALIASES: dict[frozenset[str], str] = _alias_table()


def resolve_device(text: str) -> str:
    """The catalog name of a device written as a source writes it: ``"H200 141GB"`` ->
    ``h200``, ``"V100 (DGX-2)"`` -> ``v100-sxm2-32gb``, ``"TPU v6e (Trillium)"`` ->
    ``tpu-v6e``. SpecError naming the text when no entry's name or alias matches."""
    if not isinstance(text, str):
        raise SpecError("hardware", f"hardware must be a device name (got {text!r})")
    name = ALIASES.get(device_words(text))
    if name is None:
        known = ", ".join(sorted(HARDWARE))
        raise SpecError(
            "hardware",
            f"no catalog device for {text!r} (read as {' '.join(sorted(device_words(text)))!r});"
            f" known: {known}, or add an alias in costmodel/catalog/data/hardware.json",
        )
    return name
