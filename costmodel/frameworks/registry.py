"""The framework pricing protocol and its registry: what a framework's pricing is, and how
a name finds one.

A framework's pricing says what each device holds and moves, by position in the step,
where it differs from the generic rules. Each framework is a module of this package
defining a :class:`Framework` subclass and exporting one instance as ``FRAMEWORK``; the
registry loads them by name on first use (plug-ins: no module imports another framework's).
The pricing builds on the formulas (``costmodel.parallel``), which never import it: the
engine hands a layout's framework to them (``costmodel.specs.frameworks.Pricing``). A
framework's facts (traits, the ZeRO stage it runs, the layouts it refuses) are data below
every layer, ``costmodel.specs.frameworks``.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any, ClassVar

from costmodel.parallel.state import autocast_state
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import FRAMEWORKS, Traits

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp

if TYPE_CHECKING:
    from costmodel.parallel.pipeline import PipelineRank
    from costmodel.specs.model import ModelSpec, TrainSpec
    from costmodel.specs.parallel import ParallelSpec


class Framework:
    """One training framework's pricing: what each device holds and moves, by position in
    the step, where it differs from the generic rules. Its facts (traits, the ZeRO stage
    it runs, the layouts it refuses) are its ``traits`` (:mod:`costmodel.specs.frameworks`),
    read here as attributes too (``fw.autocast``); each method's default here is what most
    frameworks do."""

    traits: ClassVar[Traits]

    def __getattr__(self, name: str) -> Any:
        """A trait of the framework (``fw.autocast``, ``fw.name``): its ``traits``'."""
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.traits, name)

    def state(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
    ) -> dict[str, sp.Expr]:
        """Bytes per device of params (working weights), master, grads and optimizer
        state; by default torch.autocast's state under ZeRO over X."""
        return autocast_state(model, train, par, rank)

    def accumulated_grad_bytes(self, train: TrainSpec, par: ParallelSpec) -> int:
        """Bytes per parameter of unsharded gradients held through the whole step; 0."""
        return 0

    def gathered(self, model: ModelSpec, train: TrainSpec, par: ParallelSpec) -> dict | None:
        """Gathered weight bytes at each position in the step where the framework models
        its peaks by position (``head``, ``head_backward`` and what ``block_peaks`` reads);
        None: the generic live-set peaks."""
        return None

    def block_peaks(self, model, train, par, peaks, **kw) -> dict[str, sp.Expr]:
        """``peaks`` with the candidates inside the blocks, where ``gathered`` models them."""
        return peaks

    def own_peaks(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, state: dict, acts: Any,
        live: Any,
    ) -> dict[str, sp.Expr] | None:  # fmt: skip
        """Peaks the framework models itself (None: the generic live-set peaks)."""
        return None

    def fsdp_group(self, model: ModelSpec, train: TrainSpec) -> dict[str, sp.Expr] | None:
        """The shard group's traffic when the framework schedules it itself (None: ZeRO's)."""
        return None

    def backward_traffic(self, model: ModelSpec, train: TrainSpec) -> sp.Expr | int:
        """HBM bytes the framework's own gradient handling moves in backward; 0."""
        return 0


@functools.cache
def registry() -> dict[str, Framework]:
    """Name -> framework: the module ``costmodel.frameworks.<name>``'s ``FRAMEWORK`` for
    each choice of ``ParallelSpec.framework`` (imported by name on first use: a plug-in,
    which imports this module for its base class)."""
    found = {}
    for name in FRAMEWORKS:
        framework = importlib.import_module(f"costmodel.frameworks.{name}").FRAMEWORK
        if framework.name != name:
            raise RuntimeError(f"costmodel.frameworks.{name} registers {framework.name!r}")
        found[name] = framework
    return found


def framework_of(par: Any) -> Framework:
    """The registered framework a layout names (``par.framework``, or a name)."""
    name = par if isinstance(par, str) else par.framework
    try:
        return registry()[name]
    except (KeyError, TypeError):
        shown = ", ".join(FRAMEWORKS)
        raise SpecError("framework", f"framework must be one of {shown} (got {name!r})") from None
