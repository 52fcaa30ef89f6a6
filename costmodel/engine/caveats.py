"""Where an answer is known to be less accurate than dense training on a calibrated GPU
(tokens/s within 3-9 % median per device on published runs), one line each.

Each :class:`Caveat` is a rule on an estimate and the sentence it adds to the verdict; the
numbers in a sentence are measured by ``python -m validate.published`` on the corpus files
it names (``tests/test_caveats.py`` recomputes them). A device's own calibration is its
profile's (``Hardware.calibration``, :mod:`costmodel.catalog.hardware`): ``basis``
``published-runs`` (checked on, some parameters fitted on, published runs), ``measured``
(``validate.probes.calibrate`` on the machine) or ``datasheet`` (vendor numbers only).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from costmodel.catalog.fitted import fitted
from costmodel.engine.estimate import Estimate, estimate
from costmodel.engine.sizing import NO_CRITICAL_BATCH
from costmodel.kinds import ffn
from costmodel.specs.frameworks import traits_of
from costmodel.specs.hardware import Hardware
from costmodel.specs.pipeline import split_slots

if TYPE_CHECKING:
    from costmodel.engine.plan import Plan

MOE_RECORD = "host"
"""The fitted record whose fit runs are the published MoE runs on GPUs
(``costmodel/catalog/data/fitted.json``): its leave-one-source-out figures are the MoE
caveat's numbers."""


def moe_figures() -> dict:
    """The MoE runs' leave-one-source-out summary (``validate.published --loso``): runs,
    sources, median and worst |error|, most negative and most positive error."""
    figs = fitted()[MOE_RECORD].figures
    return {"runs": figs["runs"], "sources": len(figs["sources"]), **figs["loso"]}


@dataclass(frozen=True)
class Caveat:
    """A known-error regime: ``applies`` to an estimate with hardware, ``says`` why."""

    name: str
    applies: Callable[[Estimate], bool]
    says: Callable[[Estimate], str]


def _basis(est: Estimate) -> str:
    assert est.hardware is not None
    return est.hardware.calibration.get("basis", "datasheet")


def calibration_line(hardware: Hardware, *, pointer: bool = True) -> str:
    """What a device's numbers rest on, short: the basis, the published runs of it and the
    highest MFU they measured (``python -m costmodel hardware NAME`` prints the summary)."""
    cal, name = hardware.calibration, hardware.name
    basis = cal.get("basis", "datasheet")
    if basis == "measured":
        return (f"measured on the machine the profile names ({name}: not necessarily yours; "
                "python -m validate.probes.calibrate measures yours)")  # fmt: skip
    n = cal.get("runs", 0)
    runs = f"{n} published run{'s' * (n != 1)} of {name} in the corpus" if n else ""
    if basis == "datasheet":
        return "datasheet only" + (f" for dense training ({runs})" if runs else "")
    line = runs or f"no published run of {name} in the corpus"
    if "max_mfu" in cal:
        line += f", highest measured MFU {cal['max_mfu']:.1%}"
    return line + (f" (python -m costmodel hardware {name} says what was fitted)" * pointer)


def _datasheet_text(est: Estimate) -> str:
    assert est.hardware is not None
    return (
        f"{est.hardware.name} is datasheet only: no published dense run checks its "
        "efficiencies, so expect larger errors than the 3-9 % median of calibrated GPUs"
    )


def _mfu_above(est: Estimate) -> bool:
    assert est.hardware is not None
    ceiling = est.hardware.calibration.get("max_mfu")
    return ceiling is not None and float(est["mfu"]) > ceiling


def _mfu_text(est: Estimate) -> str:
    assert est.hardware is not None
    cal = est.hardware.calibration
    return (
        f"MFU {float(est['mfu']):.1%} is above the highest measured on {est.hardware.name} in "
        f"the published runs ({cal['max_mfu']:.1%}, {cal['max_mfu_run']}): read it as optimistic"
    )


def _positions_text(est: Estimate) -> str:
    model, seq = est.model, est.train.seq
    return (f"seq {seq:,} is past {model.name}'s {model.max_positions:,} trained positions: "
            "memory and time are priced as asked, but the model needs position scaling "
            "(RoPE scaling such as YaRN) or long-context training for it")  # fmt: skip


def _uneven_split(est: Estimate) -> tuple[int, int] | None:
    """(slots, virtual stages) where a pipeline's layers (and the embedding and loss slots
    it counts) do not divide over its pp x v stages under a framework that must be told
    such a split (its ``pipeline_layout``); None otherwise."""
    par = est.parallel
    if par is None or par.pp == 1 or par.pp_schedule != "1f1b":
        return None
    if not traits_of(par).pipeline_layout:
        return None
    emb, loss = split_slots(par)
    slots, stages = est.model.n_layers + int(emb) + int(loss), par.pp * par.pp_interleave
    return (slots, stages) if slots % stages else None


def _odd_rounds(est: Estimate) -> bool:
    """Interleaved 1F1B whose micro-batches the pipeline ranks do not divide, under a
    framework that says something of it (its ``interleaved_rounds``)."""
    par = est.parallel
    return (par is not None and par.pp > 1 and par.pp_interleave > 1
            and bool(traits_of(par).interleaved_rounds) and par.pp_schedule == "1f1b"
            and est.train.grad_accum % par.pp != 0)  # fmt: skip


def _pipeline_text(est: Estimate) -> str:
    """What the framework must be told to run this pipeline split, and what its interleaved
    schedule does with a micro-batch count its ranks do not divide (its traits'
    ``pipeline_layout`` and ``interleaved_rounds``)."""
    par, said = est.parallel, []
    assert par is not None
    uneven = _uneven_split(est)
    if uneven:
        slots, stages = uneven
        low = slots // stages
        said.append(f"{slots} layers do not split evenly over {stages} pipeline stages "
                    f"({slots % stages} hold {low + 1}, the rest {low}; the fullest sets the "
                    f"pace, as priced): {par.framework} runs it only with an explicit "
                    f"{traits_of(par).pipeline_layout}")  # fmt: skip
    if _odd_rounds(est):
        said.append(
            f"{est.train.grad_accum} micro-batches are not a multiple of pp "
            f"{par.pp}: {traits_of(par).interleaved_rounds}"
        )
    return "; ".join(said)


CAVEATS: tuple[Caveat, ...] = (
    Caveat("positions", lambda est: est.train.seq > est.model.max_positions, _positions_text),
    Caveat("pipeline", lambda est: bool(_uneven_split(est)) or _odd_rounds(est), _pipeline_text),
    Caveat("datasheet", lambda est: _basis(est) == "datasheet", _datasheet_text),
    Caveat("mfu", _mfu_above, _mfu_text),
    Caveat(
        "moe",
        lambda est: ffn.routes(est.model),
        lambda est: _moe_text(),
    ),
)


def _moe_text() -> str:
    f = moe_figures()
    return (
        f"mixture-of-experts steps are less certain: {f['median']:.0%} median tokens/s error "
        f"on {f['runs']} published MoE runs of {f['sources']} sources, each predicted with "
        f"the fitted host costs and grouped-GEMM efficiency refitted without its source, "
        f"from {f['low']:+.0%} to "
        f"{f['high']:+.0%} (python -m validate.published --loso)"
    )


def caveats(est: Estimate, skip: Collection[str] = ()) -> list[str]:
    """The sentences of every caveat that applies to ``est`` (which has hardware), but
    those named in ``skip``."""
    return [c.says(est) for c in CAVEATS if c.name not in skip and c.applies(est)]


def plan_caveats(result: Plan, batches: Sequence[int] | None = None) -> list[str]:
    """What ``estimate`` cautions of a plan's best layout (:func:`caveats`) and, where a
    batch range was searched (``batches``; None: the batches of the plan's rows), that
    nothing bounds the batch but the range (the CLI's, the API's and the app's plan say
    the same)."""
    if not len(result.order):
        return []
    if batches is None:
        batches = [int(b) for b in set(result.columns["batch"].tolist())]
    best = int(result.order[0])
    train = result.train_spec(best)
    said = caveats(estimate(result.model, train, result.parallel_spec(best), result.hardware))
    if batches and len(set(batches)) > 1:
        said.append(f"the global batch was searched from {min(batches):,} to {max(batches):,} "
                    f"and the best takes {train.batch:,}: {NO_CRITICAL_BATCH}, so bound "
                    "the batch range by what the training tolerates")  # fmt: skip
    return said
