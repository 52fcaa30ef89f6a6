"""The numbers of one configuration: every quantity of its structure, evaluated exactly.

Counts (parameters, FLOPs, bytes) come out as exact Python integers: the formulas run on
exact fractions (``costmodel.symbols.algebra.numeric``). With a layout and hardware,
per-device memory, time, MFU and (given a token budget) days and cost of training are
added.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import html
import json
from collections.abc import ItemsView, Iterator, KeysView
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from costmodel.config import check
from costmodel.engine.fit import PEAK, Fit, judge, rest_at_peak
from costmodel.engine.quantities import (
    BUDGET_KEYS,
    DEVICE_ROOTS,
    MEMORY,
    TIMES,
    expressions,
    nest,
    quantities,
    structure_of,
)
from costmodel.kinds.routing import routing_values
from costmodel.parallel.layout import layout_values
from costmodel.specs import checks
from costmodel.specs.checks import Quantities, SpecError, UnknownKey
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.algebra import Var, by_symbol
from costmodel.symbols.core import (
    BUDGET_SYMBOLS,
    HARDWARE_SYMBOLS,
    PARALLEL_SYMBOLS,
    N_tok,
    numeric,
    price,
    values_for,
)

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

UNFIT = ("mfu", "hfu", "tflops_per_device", "train_days", "train_cost")
"""Quantities that are no answer for a layout that does not fit: its verdict withholds
them (its times stay, as ``--full`` prints them: what it would take if it ran);
``est[key]`` still gives what the formula says."""


@dataclass(frozen=True, repr=False)
class Estimate:
    """Numbers (exact ints where the quantity is a count) and expressions of one config.

    Read-only and dict-like over its quantities (``est["time_s.step"]``, ``in``, ``keys()``,
    ``items()``; seconds, bytes, FLOPs as the key says); in a notebook it shows as a short
    table (model, layout, fit verdict, step time, MFU, peak memory). A layout that does not
    fit keeps every quantity (what it would take if it ran); its verdict, ``summary`` and
    ``to_dict`` give no MFU, days or cost for it (:data:`UNFIT`)."""

    model: ModelSpec
    train: TrainSpec
    values: dict[str, int | float]
    """Every quantity by key (a :class:`Quantities`: ``values()`` works as a dict's)."""
    parallel: ParallelSpec | None = None
    hardware: Hardware | None = None
    notes: tuple[str, ...] = ()
    """What the inputs took by default (``costmodel.inputs.Setup.notes``)."""
    headroom: float | None = None
    """The share of the device's memory the fit rule lets a peak take (the inputs'
    ``memory_headroom``; None: ``costmodel.engine.fit.DEFAULT_HEADROOM``)."""
    defaulted: frozenset[str] = frozenset()
    """Inputs not given, which the verdict's assumptions line names as defaults."""
    caveats: tuple[str, ...] = ()
    """Regimes of known error this configuration is in (``costmodel.engine.caveats``), as
    the CLI's verdict lists them; filled by ``costmodel.estimate``."""

    def __post_init__(self) -> None:
        if not isinstance(self.values, Quantities):
            object.__setattr__(self, "values", Quantities(self.values))

    def __getitem__(self, key: str) -> int | float:
        try:
            return self.values[key]
        except (KeyError, TypeError):  # TypeError: an unhashable key
            raise UnknownKey(key, self.missing(key)) from None

    def missing(self, key: str, listed: str = "est.keys() lists them all") -> str:
        """Why ``key`` is not a quantity of this estimate: one that needs a device (a
        layout's memory, communication and time), or one it does not know (the closest
        it knows; ``est[key]`` and ``est.expr(key)`` raise this as :class:`UnknownKey`)."""
        if self.hardware is None and str(key).split(".")[0] in DEVICE_ROOTS:
            known = (*MEMORY, *TIMES)
            if key in known or not difflib.get_close_matches(str(key), known, n=1):
                return f"{key!r} needs a device: give hardware (the CLI's --hardware)"
            said = checks.unknown("quantity", key, known, "")
            return f"{said} These are a device's: give hardware"
        return checks.unknown("quantity", key, self.values, listed)

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def keys(self) -> KeysView[str]:
        return self.values.keys()

    def items(self) -> ItemsView[str, int | float]:
        return self.values.items()

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def expr(self, key: str) -> sp.Expr:
        """The symbolic expression behind ``key`` (sizes as symbols, those of
        :mod:`costmodel.symbols`); ``est.evaluate(expr)`` gives its number. The achieved
        rates in it (``C_eff``, ``C_attn``, ``C_attn_b``, ``W_hbm``, the links') are this
        estimate's: the attention kernels' depend on the sequence length, so substituting
        another ``T`` moves the FLOPs and bytes but not those rates (estimate again at the
        other length for its number)."""
        if isinstance(key, str):
            with contextlib.suppress(UnknownKey):  # then the same sentence as est[key]'s
                return _expr(structure_of(self.model, self.train, self.parallel), key)
        raise UnknownKey(key, self.missing(key))

    def evaluate(self, expr: sp.Expr | str) -> int | float:
        """The number of ``expr`` (or of the quantity named so) here: every symbol replaced
        by its value at once (``xreplace``: a fraction of a second where ``.subs``, which
        simplifies after each symbol, takes tens of seconds on a step-time formula)."""
        import sympy as sp

        formula = self.expr(expr) if isinstance(expr, str) else expr
        if isinstance(formula, Var):
            formula = formula.sym
        if not isinstance(formula, sp.Basic):
            raise SpecError("expr", f"evaluate takes a quantity's name or a sympy expression "
                            f"(got {type(expr).__name__})")  # fmt: skip
        out = formula.xreplace(self.symbol_values())
        if not isinstance(out, sp.Basic):  # a bare symbol becomes its Python number
            return out
        if out.free_symbols:
            names = ", ".join(sorted(str(s) for s in out.free_symbols))
            raise SpecError("expr", f"the formula uses symbols this estimate has no value "
                            f"for: {names}")  # fmt: skip
        if out.has(sp.Derivative, sp.Subs):  # sympy left d/dx of ceiling, max or min
            raise SpecError("expr", "the formula holds a derivative sympy cannot take (of "
                            "the ceilings of GEMM tiles and waves, or of a max or min): "
                            "difference two estimates (e.g. at seq and seq + 1)")  # fmt: skip
        return int(out) if out.is_Integer else float(out)

    def symbol_values(self) -> dict[sp.Symbol, int | float]:
        """Every symbol a formula may use -> its number here (degrees and links of the
        layout, 1 without one; the budget symbols 0), keyed by sympy symbols (indexed by
        them or by ``costmodel.symbols``' own): ``est.evaluate(expr)`` uses them."""
        values = symbol_values(self.model, self.train, self.parallel, self.hardware)

        return by_symbol({k: _as_number(v) for k, v in values.items()})

    def summary(self) -> dict[str, str]:
        """The few lines a reader wants first, as label -> text (seconds, GiB)."""
        t = self.train
        tuning = "" if t.finetune == "full" else f", {t.finetune}"
        out = {"model": f"{self.model.name}: batch {t.batch} x seq {t.seq}, {t.precision}"
                        f"{tuning}, grad-accum {t.grad_accum}"}  # fmt: skip
        if self.parallel is not None and self.hardware is not None:
            p = self.parallel
            said = {"gpus": f" (gpus not given: {p.devices} from the degrees)",
                    "framework": " (the default framework: set framework)"}  # fmt: skip
            count, fw = (said[k] * (k in self.defaulted) for k in ("gpus", "framework"))
            out["layout"] = (f"{p.devices} x {self.hardware.name}{count}, {p.framework}{fw}: "
                             f"dp {p.dp}, "
                             f"fsdp {p.fsdp}, tp {p.tp}, pp {p.pp}, cp {p.cp}, ep {p.ep}; "
                             f"recompute {self.train.recompute}")  # fmt: skip
            fit = self.fit()
            out["verdict"] = fit.sentence()
            if fit.fits:
                out["step"] = f"{self['time_s.step']:.4g} s"
                out["MFU"] = f"{self['mfu']:.1%}"
                if "train_days" in self.values:  # a token budget given, as the CLI prints
                    cost = f", ${self['train_cost']:,.0f}" if "train_cost" in self.values else ""
                    out["training"] = f"{self['train_days']:,.2f} days{cost}"
            out["peak"] = f"{self['memory_bytes_per_device.peak'] / 2**30:,.2f} GiB per device"
        else:
            out["peak"] = f"{self['memory_bytes.peak'] / 2**30:,.2f} GiB (one device)"
        out.update({f"note {i}": n for i, n in enumerate(self.notes, 1)})
        out.update({f"caveat {i}": c for i, c in enumerate(self.caveats, 1)})
        return out

    def __repr__(self) -> str:
        lines = [f"  {k}: {v}" for k, v in self.summary().items()]
        return "\n".join(["Estimate(", *lines, f"  [{len(self)} quantities: est.keys()])"])

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
                       for k, v in self.summary().items())  # fmt: skip
        return f"<table><caption>Estimate ({len(self)} quantities)</caption>{rows}</table>"

    def fit(self, headroom: float | None = None, budget: float | None = None) -> Fit:
        """Whether this layout fits its devices: the one rule of
        :func:`costmodel.engine.fit.judge` (the peak within headroom x device memory,
        default the estimate's own ``headroom``, else
        :data:`costmodel.engine.fit.DEFAULT_HEADROOM`, or ``budget`` bytes)."""
        if self.hardware is None or self.parallel is None:
            raise SpecError("hardware", "a fit verdict needs hardware (and a layout)")
        if headroom is not None and budget is not None:  # as max_seq and max_batch refuse it
            raise SpecError("budget", "give headroom or budget, not both: a budget is the "
                            "bytes allowed, a headroom the device's share")  # fmt: skip
        return judge(self.values, self.hardware, self.headroom if headroom is None else headroom,
                     budget)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """Nested dict for JSON, as the CLI's ``--json`` gives it after its ``verdict``
        (``costmodel.verdict(est)``): specs plus every quantity, with the memory table's
        ``transients`` (what its parts leave of the peak) and no answer (None) for
        :data:`UNFIT`'s quantities of a layout that does not fit."""
        out = {"model": _fields(self.model), "train": _fields(self.train)}
        if self.parallel is not None:
            out["parallel"] = _fields(self.parallel)
        if self.hardware is not None:
            out["hardware"] = self.hardware.name
        out.update(nest(self.values))
        if PEAK in self.values:  # the parts then add to the peak, as the CLI's table
            out["memory_bytes_per_device"]["transients"] = rest_at_peak(self.values)
            if not self.fit().fits:
                out.update({k: None for k in UNFIT if k in out})
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)


@functools.lru_cache(maxsize=256)
def _expr(structure: tuple, key: str) -> sp.Expr:
    """One quantity's expression with subs-safe Max/Min (built once: seconds for a step)."""
    comp = expressions(structure)
    if key not in comp.keys:
        raise UnknownKey(key, checks.unknown("quantity", key, comp.keys, "est.keys() lists them"))
    from costmodel.symbols.forms import subs_safe  # sympy: only where a formula is asked

    return subs_safe(comp.exprs[comp.keys.index(key)])


def _fields(spec: Any) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def _as_number(value: Any) -> int | float:
    if isinstance(value, Fraction):  # exact arithmetic of counts (symbols.algebra)
        return int(value) if value.denominator == 1 else float(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def budget_values(token_budget: Any, price_per_hour: Any) -> dict[sp.Symbol, Any]:
    """Values of the budget symbols (0 where not given: their quantities are then dropped)."""
    if token_budget is not None:
        checks.number("token_budget", token_budget)
    if price_per_hour is not None:
        checks.number("price_per_hour", price_per_hour, allow_zero=True)
    return {N_tok: token_budget or 0, price: price_per_hour or 0}


def symbol_values(
    model: Any, train: Any, parallel: Any = None, hardware: Hardware | None = None
) -> dict[sp.Symbol, Any]:
    """Every symbol's number. The specs may be ModelSpec/TrainSpec/ParallelSpec or any
    object with their fields holding numpy arrays (``sweep``); parallel and hardware
    symbols are 1 without a layout, and the budget symbols 0."""
    values: dict[sp.Symbol, Any] = dict.fromkeys(PARALLEL_SYMBOLS + HARDWARE_SYMBOLS, 1)
    values.update(dict.fromkeys(BUDGET_SYMBOLS, 0))
    values.update(values_for(model, train))
    if parallel is not None:
        if hardware is None:
            raise SpecError("hardware", "hardware is required with a parallel layout")
        values.update(layout_values(train, parallel, hardware))
    values.update(routing_values(model, parallel, values))
    return values


def estimate(
    model: ModelSpec,
    train: TrainSpec,
    parallel: ParallelSpec | None = None,
    hardware: Hardware | None = None,
    *,
    token_budget: float | None = None,
    price_per_hour: float | None = None,
) -> Estimate:
    """Evaluate every quantity for one configuration (exact integers for counts).

    With ``token_budget`` (tokens; needs a layout) adds ``train_days``, and with
    ``price_per_hour`` (per device-hour) ``train_cost``.
    """
    check(model, train, parallel)
    if token_budget is not None and parallel is None:
        raise SpecError("token_budget", "token_budget needs a layout and hardware (a step time)")
    values = symbol_values(model, train, parallel, hardware)
    values.update(budget_values(token_budget, price_per_hour))
    with numeric(values):  # the formulas computed on numbers: no expression is built
        numbers = quantities(model, train, parallel)
    dropped = _unasked(token_budget, price_per_hour)
    out = {k: _as_number(x) for k, x in numbers.items() if k not in dropped}
    return Estimate(model, train, out, parallel, hardware)


def _unasked(token_budget: Any, price_per_hour: Any) -> set[str]:
    """Budget quantities that were not asked for (a zero budget is no answer)."""
    if token_budget is None:
        return set(BUDGET_KEYS)
    return {"train_cost"} if price_per_hour is None else set()


def exact(model: ModelSpec, train: TrainSpec, key: str) -> sp.Expr:
    """Evaluate one quantity by sympy substitution (slow; the reference for tests)."""
    comp = expressions(structure_of(model, train))
    return comp.exprs[comp.keys.index(key)].subs(values_for(model, train))
