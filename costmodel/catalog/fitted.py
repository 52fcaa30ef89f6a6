"""The catalog's fitted parameters as records: what each is, its value, how it was fitted,
on which published runs, and its error in-sample and leave-one-source-out.

``data/fitted.json`` holds one record per parameter. A record names the hardware fields it
sets (``Axis``), the catalog devices that hold it, the value where no published run
constrains it (``prior``), the grid its fit searches, the runs it is fitted on and the
objective (least squares in log of predicted over measured, optionally under a bound on
the worst run), and what ``python -m validate.published --loso`` measured: the error on
its fit runs at the catalog value (in-sample) and with each run predicted by a refit that
left the run's source out (leave-one-source-out). ``tests/test_fitted.py`` holds the
catalog's profiles equal to the records and the figures equal to a fresh LOSO run.
Torch-free; no sympy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware

__all__ = ["Axis", "FitRuns", "Fitted", "apply", "fitted", "fitted_lines", "holds", "reads"]


@dataclass(frozen=True)
class Axis:
    """One fitted number and the hardware fields it sets.

    Each field in ``sets`` becomes ``value x base``, where a base is a number (1 for a plain
    parameter) or the name of another field of the same profile, read after the records
    before it are applied (``efficiency.serve_matmul`` as a ratio to ``efficiency.matmul``)."""

    name: str
    value: float
    prior: float
    """What the profile would hold without the runs that fit it (a datasheet or published
    measurement, or 0 for a term not modelled): a leave-one-source-out fold whose fit runs
    are all from the source left out predicts with it."""
    grid: tuple[float, ...]
    sets: tuple[tuple[str, float | str], ...]
    """(field, base) pairs: ``efficiency.network`` or a top-level Hardware field."""


@dataclass(frozen=True)
class FitRuns:
    """Which published rows a record is fitted on: the corpus files, the quantity, and the
    conditions a row's case must meet (``moe``, ``kind``, ``framework``, ``recompute``,
    ``devices``: its catalog device among these)."""

    files: tuple[str, ...]
    quantity: str
    where: dict[str, Any] = field(default_factory=dict)
    bound_worst: float | None = None
    """Least squares under the bound that no fit run's |error| exceeds this (None: none)."""


@dataclass(frozen=True)
class Fitted:
    """One fitted parameter (or a few fitted jointly), its fit and its measured error."""

    name: str
    devices: tuple[str, ...]
    axes: tuple[Axis, ...]
    fit: FitRuns
    method: str
    figures: dict[str, Any] = field(default_factory=dict)
    """What ``validate.published --loso`` measured on the fit runs: ``runs``, ``sources``,
    ``in_sample`` and ``loso`` (each ``median``, ``p90``, ``worst`` |error|), ``refit``
    (the fit on every run) and ``folds`` (source left out -> the values refitted without
    it)."""

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(a.value for a in self.axes)

    @property
    def priors(self) -> tuple[float, ...]:
        return tuple(a.prior for a in self.axes)


SERVING_ONLY = frozenset({"efficiency.decode", "efficiency.serve_matmul",
                          "efficiency.serve_grouped", "serve_layer_s"})  # fmt: skip
"""Fields only ``costmodel serve`` reads."""
TRAINING_ONLY = frozenset({"efficiency.network", "expert_call_s", "allocator_reserve", "launch_s",
                           "efficiency.grouped"})  # fmt: skip
"""Fields only a training estimate reads (serving runs one node, without experts' loops or
the caching allocator's reserve, and prices its GEMMs at its own ``serve_matmul``)."""


def reads(record: Fitted) -> frozenset[str]:
    """Which estimates read the record's fields: ``training``, ``serving`` or both (a
    field neither list names, as ``efficiency.matmul``, is read by both)."""
    fields = {path for axis in record.axes for path, _ in axis.sets}
    out = set()
    if fields - SERVING_ONLY:
        out.add("training")
    if fields - TRAINING_ONLY:
        out.add("serving")
    return frozenset(out)


def holds(record: Fitted, hw: Hardware) -> bool:
    """Whether the profile ``hw`` is one the record sets (a catalog name it lists)."""
    return hw.name in record.devices


def _read(hw: Hardware, path: str) -> float:
    """A field's value: ``efficiency.KEY``, ``attention_kernels.NAME.PASS`` or a
    top-level Hardware field."""
    parts = path.split(".")
    if parts[0] == "efficiency":
        return hw.eff(parts[1])
    if parts[0] == "attention_kernels":
        return float(hw.attention_kernels[parts[1]][parts[2]])
    return float(getattr(hw, path))


def _write(hw: Hardware, path: str, value: float) -> Hardware:
    parts = path.split(".")
    if parts[0] == "efficiency":
        return replace(hw, efficiency={**hw.efficiency, parts[1]: value})
    if parts[0] == "attention_kernels":
        name, key = parts[1], parts[2]
        kernel = {**hw.attention_kernels[name], key: value}
        return replace(hw, attention_kernels={**hw.attention_kernels, name: kernel})
    return replace(hw, **{path: value})


def apply(record: Fitted, hw: Hardware, values: tuple[float, ...]) -> Hardware:
    """``hw`` with the record's fields set from ``values`` (one per axis), rounded to 12
    significant digits as the catalog states them; ``hw`` itself where the record does not
    hold it."""
    if not holds(record, hw):
        return hw
    for axis, value in zip(record.axes, values, strict=True):
        for path, base in axis.sets:
            scale = _read(hw, base) if isinstance(base, str) else base
            hw = _write(hw, path, float(f"{value * scale:.12g}"))
    return hw


def _axis(data: dict[str, Any]) -> Axis:
    sets = tuple((k, v) for k, v in data["sets"].items())
    return Axis(name=data["name"], value=float(data["value"]), prior=float(data["prior"]),
                grid=tuple(float(g) for g in data["grid"]), sets=sets)  # fmt: skip


def _record(name: str, data: dict[str, Any]) -> Fitted:
    fit = data["fit"]
    runs = FitRuns(files=tuple(fit["files"]), quantity=fit["quantity"],
                   where=dict(fit.get("where", {})),
                   bound_worst=fit.get("bound_worst"))  # fmt: skip
    axes = tuple(_axis(a) for a in data["axes"])
    return Fitted(name=name, devices=tuple(data["devices"]), axes=axes, fit=runs,
                  method=data["method"], figures=dict(data.get("figures", {})))  # fmt: skip


@cache
def fitted() -> dict[str, Fitted]:
    """Every fitted parameter of the catalog, by name, in the order they are fitted (a
    later record's fit sees the earlier ones' values)."""
    text = resources.files("costmodel.catalog").joinpath("data/fitted.json").read_text()
    data = json.loads(text)
    try:
        return {k: _record(k, v) for k, v in data.items() if not k.startswith("_")}
    except (KeyError, TypeError, ValueError) as err:
        where = "costmodel/catalog/data/fitted.json"
        raise SpecError("fitted", f"{where}: bad record ({err})") from None


AXIS_WORDS = {
    "clock ratio": ("the clock a 500 W cap leaves, of the SXM5's", ""),
    "efficiency.network": ("achieved share of the NIC line rate", ""),
    "allocator_reserve": ("allocator reserve", " reserved bytes per allocated byte"),
    "host seconds per launch (x86 host)": ("host time per kernel launch", " s"),
    "efficiency.matmul": ("achieved share of peak in GEMMs", ""),
    "efficiency.attention": ("achieved share of peak in attention", ""),
    "efficiency.grouped": ("per-expert loop's GEMMs' share of a dense GEMM's efficiency", ""),
    "efficiency.decode": ("achieved share of HBM bandwidth in decode", ""),
    "serve_matmul ratio": ("serving GEMMs' share of the training GEMM efficiency", ""),
    "serve_layer_s": ("serving overhead per layer per step", " s"),
    "efficiency.serve_grouped": ("serving's routed experts' share of its dense matmuls' rate", ""),
}
"""How a fitted axis reads in words, and its unit (``costmodel hardware NAME``)."""


def _values_text(record: Fitted) -> str:
    """The record's fitted values by axis, in words with units, e.g. ``achieved share of
    the NIC line rate 0.8 (efficiency.network)``."""
    said = []
    for axis in record.axes:
        words, unit = AXIS_WORDS.get(axis.name, (axis.name, ""))
        value = f"{axis.value:.4g}{unit}"
        if unit == " s" and axis.value < 1e-3:
            value = f"{axis.value * 1e6:.3g} µs"
        field = f" ({axis.name})" if " " not in axis.name and words != axis.name else ""
        said.append(f"{words} {value}{field}")
    return ", ".join(said)


def fitted_lines(device: str) -> list[str]:
    """One line per fitted parameter the catalog device holds: its value, the runs and
    sources it is fitted on, and its error on them in-sample and leave-one-source-out
    (what ``python -m validate.published --loso`` recorded)."""
    lines = []
    for name, record in fitted().items():
        if device not in record.devices:
            continue
        figs = record.figures
        head = f"{name}: {_values_text(record)}"
        if not figs.get("runs"):
            lines.append(f"{head} (no figures recorded)")
            continue
        inside, loso = figs["in_sample"], figs["loso"]
        lines.append(
            f"{head}; fitted on {figs['runs']} runs of {len(figs['sources'])} "
            f"source{'s' * (len(figs['sources']) != 1)}: "
            f"median |error| {inside['median']:.1%} in-sample, {loso['median']:.1%} with "
            f"each source left out of the fit (worst {loso['worst']:.0%})"
        )
    return lines


LOSO_SENTENCE = "Fitted parameters, each with its error on the runs it is fitted on"


def loso_sentence() -> str:
    """The sentence ``data/hardware.json``'s ``_notes`` ends with: every fitted parameter's
    leave-one-source-out and in-sample median and worst |error| on its fit runs (written by
    ``python -m validate.published --loso --record``, held by ``tests/test_fitted.py``)."""
    parts = []
    for name, record in fitted().items():
        f = record.figures
        loso, inside = f["loso"], f["in_sample"]
        parts.append(
            f"{name} leave-one-source-out {100 * loso['median']:.1f} % median, worst "
            f"{100 * loso['worst']:.1f} % (in-sample {100 * inside['median']:.1f} %, "
            f"{100 * inside['worst']:.1f} %) on {f['runs']} runs of {len(f['sources'])} sources"
        )
    return (
        f"{LOSO_SENTENCE}, each source predicted by a refit without it (python -m "
        f"validate.published --loso; costmodel/catalog/data/fitted.json): {'; '.join(parts)}."
    )
