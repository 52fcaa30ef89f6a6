"""What ``serve`` answers, the same in the CLI, the app and the API: the estimate, whether
its batch fits, the nearest change that fits when it does not, and the caveats of the
regime (a mixture-of-experts model, a device no published run checks).

A batch that does not fit has no TTFT, TPOT or throughput (as ``estimate`` withholds a step
time for a layout that does not fit): where :attr:`ServeAnswer.fits` is False every reader
shows the memory and the nearest fit instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from costmodel.answers import as_fields
from costmodel.answers.serve_nearest import nearest_fit
from costmodel.answers.serve_words import assumptions, limited_by
from costmodel.catalog.fitted import fitted
from costmodel.engine.caveats import calibration_line
from costmodel.engine.quantities import nest
from costmodel.kinds import ffn
from costmodel.serving.estimate import ServeEstimate, serve
from costmodel.serving.queueing import overloaded
from costmodel.serving.result import how_many
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT as DEFAULT_ENGINE
from costmodel.specs.engines import engine
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import ServeSpec
from costmodel.units import fmt_rate

SERVING_RECORD = "serving"
"""The fitted record of the serving parameters (``costmodel/catalog/data/fitted.json``):
its figures on the published MoE serving runs are the MoE caveat's numbers."""


SERVED_ON = ("a100-80gb", "h100-sxm", "h200", "mi300x")
"""The devices of the fitted serving corpus's runs (``validate/published/serving_runs.json``;
``tests/test_api_serve.py`` holds them equal)."""
DEFAULT_HARDWARE = "h100-sxm"
"""The device ``serve`` prices on where none is given (the CLI's and the API's; said)."""
DEFAULT_OUTPUT = 128
"""Generated tokens when only ``context`` is given (the prompt is the rest)."""
WORKLOAD = ("context", "input", "output")
"""The lengths of a request: any two of them, or ``context`` alone."""
SERVE_INPUTS = (*WORKLOAD, "gpus",
                *(f.name for f in fields(ServeSpec) if f.name not in WORKLOAD))  # fmt: skip
"""What a serving question takes, by the CLI's names without the dashes (``gpus``: the
devices of the deployment, its replicas the rest of tp x pp, as ``estimate`` fills dp)."""


def lengths(context: int | None, inp: int | None, out: int | None) -> tuple[int, int]:
    """(input, output) from any two of context, input and output (or context alone: the
    last ``DEFAULT_OUTPUT`` tokens generated); one line naming the field otherwise."""
    for name, value in (("context", context), ("input", inp), ("output", out)):
        if value is not None:
            checks.integer(name, value, minimum=2 if name == "context" else 1)
    if context is None:
        if inp is None:
            raise SpecError("context", "give --context, or --input (and --output)")
        return inp, DEFAULT_OUTPUT if out is None else out
    if inp is not None and out is not None and inp + out != context:
        raise SpecError("context", f"context ({context}) must be input + output ({inp + out})")
    if inp is not None and inp >= context:
        raise SpecError("input", f"input ({inp}) must be < context ({context})")
    out = out if out is not None else (context - inp if inp is not None else DEFAULT_OUTPUT)
    if out >= context:
        raise SpecError("output", f"output ({out}) must be < context ({context})")
    return context - out, out


def spec_of(values: Mapping[str, Any]) -> ServeSpec:
    """The serving spec of a question as the CLI and the API state it (``SERVE_INPUTS``;
    None: not given): the lengths from any two of context, input and output; the batch 1
    (a request at a time), or for a rate or a closed loop the engine's ``max_num_seqs`` cap;
    arrival ``together``, ``poisson`` at a request rate (what benchmarks send, simulated),
    ``continuous`` for a closed loop of ``concurrency`` users; every other field
    ServeSpec's default. An unknown name is a SpecError naming it."""
    unknown = sorted(set(values) - set(SERVE_INPUTS))
    if unknown:
        raise SpecError(unknown[0], f"unknown serving input(s): {', '.join(unknown)}; "
                        f"known: {', '.join(SERVE_INPUTS)}")  # fmt: skip
    given = {k: v for k, v in values.items() if v is not None}
    inp, out = lengths(given.pop("context", None), given.pop("input", None),
                       given.pop("output", None))  # fmt: skip
    _replicas(given)
    rated = given.get("request_rate") is not None
    users = given.get("concurrency") is not None
    if "draft_layers" in given and not given.get("draft_tokens"):
        raise SpecError("draft_layers", "draft_layers sizes the speculative drafter: it needs "
                        "draft_tokens > 0 (the tokens it proposes a step)")  # fmt: skip
    if "requests" in given and not (rated or users):
        raise SpecError("requests", "requests makes a simulated workload a benchmark of that "
                        "many: give request_rate or concurrency with it (a batch is priced "
                        "whole)")  # fmt: skip
    cap = engine(given.get("engine", DEFAULT_ENGINE)).max_seqs
    given.setdefault("batch", cap if rated or users else 1)
    given.setdefault("arrival", "poisson" if rated else "continuous" if users else "together")
    return ServeSpec(input=inp, output=out, **given)


def _replicas(given: dict[str, Any]) -> None:
    """``gpus`` as replicas: dp = gpus / (tp x pp), or a check that dp says the same."""
    gpus = given.pop("gpus", None)
    if gpus is None:
        return
    checks.integer("gpus", gpus)
    if given.get("prefill_replicas"):
        raise SpecError("gpus", "gpus with prefill_replicas: give dp (decode replicas) and "
                        "prefill_replicas instead")  # fmt: skip
    per = given.get("tp", 1) * given.get("pp", 1)
    if gpus % per:
        raise SpecError("gpus", f"gpus ({gpus}) must be a multiple of tp x pp ({per})")
    if given.get("dp", gpus // per) != gpus // per:
        raise SpecError("gpus", f"gpus ({gpus}) must be tp x pp x dp ({per * given['dp']})")
    given["dp"] = gpus // per


@dataclass(repr=False)
class ServeAnswer(Mapping):
    """One serving question's answer: the estimate and what to say beside it. Dict-like
    over the estimate's numbers (``ans["time_s.tpot"]``; a batch that does not fit keeps
    them for whoever asks by name, as ``estimate`` does, but its repr shows none)."""

    estimate: ServeEstimate
    fits: bool
    nearest: str | None = None
    """Without a fit: the nearest change that fits (flags named as the CLI's)."""
    caveats: list[str] = field(default_factory=list)
    replicas: int = 1
    """The deployment's replicas (dp): the count says a replica's and their total."""
    spec: ServeSpec | None = None
    """The question as priced (its assumptions are said from it)."""
    defaulted: tuple[bool, bool, bool] = (False, False, False)
    """Whether the output length, the batch and the engine were left to their defaults
    (the assumptions say so)."""
    keywords: bool = False
    """Say settings by the API's keyword names (``engine``) rather than the CLI's flags."""

    def __getitem__(self, key: str) -> Any:
        if self._static_prefill(key):
            raise KeyError(f"{key}: the prefill of every prompt at once, which this "
                           "workload's continuous batching does not run (its TTFT is "
                           "time_s.ttft)")  # fmt: skip
        return self.estimate[key]

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.estimate if not self._static_prefill(k))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def _static_prefill(self, key: str) -> bool:
        """A static batch's prefill quantity under continuous batching (``STATIC_PREFILL``:
        the CLI and its --json leave them out; so does the answer)."""
        return (self.spec is not None and self.spec.arrival != "together"
                and key.startswith(STATIC_PREFILL))  # fmt: skip

    def __repr__(self) -> str:
        v = self.estimate.values
        if not self.fits:
            head = f"{self.headline()}: {self.how_many()}; nearest fit: {self.nearest}"
        else:
            shown = [f"{label} {_seconds(v[key])}" for key, label in (
                ("time_s.ttft", "TTFT"), ("time_s.tpot", "TPOT")) if key in v]  # fmt: skip
            shown.append(f"tokens/s {v['throughput.output_tokens_per_s']:,.4g}")
            head = f"{self.headline()}: {self.how_many()}; {', '.join(shown)}"
        said = [f"limited by: {self.limited_by()}"] * (self.limited_by() is not None)
        said += [f"assumptions: {self.assumptions()}"] * (self.spec is not None)
        said += [f"caveat: {c}" for c in self.caveats]
        return (
            "\n".join(
                [
                    f"ServeAnswer({head}; {len(self.caveats)} caveat(s)",
                    *(f"  {line}" for line in said),
                ]
            )
            + ")"
        )

    def _words(self, text: str) -> str:
        return as_fields(text) if self.keywords else text

    def limited_by(self) -> str | None:
        """What limits a fitting answer (:func:`~costmodel.answers.serve_words.limited_by`);
        None without a fit or a spec."""
        if not self.fits or self.spec is None:
            return None
        return self._words(limited_by(self.estimate.values, self.spec.output))

    def assumptions(self) -> str:
        """Every setting the numbers assume, the defaults named as defaults
        (:func:`~costmodel.answers.serve_words.assumptions`)."""
        if self.spec is None:
            return ""
        return self._words(assumptions(self.spec, *self.defaulted))

    def verdict(self) -> dict[str, Any]:
        """The verdict as the CLI's ``--json`` gives it."""
        return {"fits": self.fits, "overloaded": self.overloaded, "nearest": self.nearest,
                "caveats": self.caveats, "limited_by": self.limited_by(),
                "assumptions": self.assumptions()}  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The CLI's ``serve --json`` of this answer: the spec priced, the verdict, the
        quantities shown (nested; none of time where the batch does not fit, no static
        prefill under continuous batching) and the notes."""
        assert self.spec is not None, "an answer built without its spec"
        return {"spec": asdict(self.spec), "verdict": self.verdict(),
                **nest(shown_values(self, self.spec)), "notes": list(self.notes)}  # fmt: skip

    def how_many(self) -> str:
        """How many sequences fit, in the verdict's words (:func:`how_many`): the CLI's,
        the app's and the repr's."""
        v = self.estimate.values
        return how_many(v["max_batch"], self.replicas, v.get("memory_bytes_per_device.kv_room"))

    def headline(self) -> str:
        """The verdict's first words, the same in the CLI, the app and the repr: whether it
        fits, and where it fits but the load does not (an open loop offered more than it
        serves; a closed loop whose users a replica cannot all hold at once)."""
        v = self.estimate.values
        if not self.fits:
            return "does NOT fit"
        if self.overloaded:
            return (f"fits, but OVERLOADED ({fmt_rate(v['workload.sustained_per_s'])} of "
                    f"{fmt_rate(v['workload.offered_per_s'])} requests/s served)")  # fmt: skip
        waiting = v.get("workload.users_waiting", 0)
        if waiting:
            slots = v.get("workload.slots", v["max_batch"])
            why = (f"{v['max_batch']:,} sequences fit at once" if slots >= v["max_batch"] else
                   f"a replica holds {slots:,} at once (the --batch or engine cap; "
                   f"{v['max_batch']:,} fit its memory)")  # fmt: skip
            return f"fits, but QUEUED ({waiting:,} of each replica's users wait for a slot: {why})"
        return "fits"

    @property
    def overloaded(self) -> bool:
        """Whether an open loop is offered more requests/s than the deployment serves."""
        return overloaded(self.estimate.values)

    @property
    def notes(self) -> list[str]:
        """What the estimate assumes beyond the spec (the CLI's ``note`` lines)."""
        return self.estimate.notes


def _seconds(t: float) -> str:
    return f"{t * 1e3:,.4g} ms" if t < 1 else f"{t:,.4g} s"


TIMED = (
    "time_s.",
    "throughput.",
    "workload.",
    "flops_per_device.",
    "bytes_per_device.",
    "continuous.",
    "speculative.",
    "disaggregated.",
    "pipeline.",
)
"""The prefixes of an estimate's time and throughput quantities: what an answer withholds
where the batch does not fit."""


STATIC_PREFILL = ("time_s.prefill.", "flops_per_device.prefill")
"""A static batch's prefill of every prompt at once, which continuous batching (users, a
request rate or ``--arrival continuous``) does not run: its TTFT is the workload's."""


def shown_values(ans: ServeAnswer, spec: ServeSpec) -> dict[str, Any]:
    """The estimate's quantities an answer shows: all of them where the batch fits, its
    memory only where it does not (as the text and the app show no time for it); under
    continuous batching not the static batch's prefill of every prompt at once."""
    values = ans.estimate.values
    together = spec.arrival == "together"
    hidden = TIMED if not ans.fits else () if together else STATIC_PREFILL
    return {k: v for k, v in values.items() if not (hidden and k.startswith(hidden))}


def answer(
    model: ModelSpec,
    spec: ServeSpec,
    hw: Hardware,
    defaulted: tuple[bool, bool, bool] = (False, False, False),
) -> ServeAnswer:
    """The estimate of ``spec``, its verdict, the nearest fit and the caveats; ``defaulted``:
    whether the output, the batch and the engine were left to their defaults."""
    est = serve(model, spec, hw)
    fits = bool(est["fits"])
    nearest = None if fits else nearest_fit(model, spec, hw, est)
    caveats = serve_caveats(model, hw) + _over_cap(spec)
    return ServeAnswer(est, fits, nearest, caveats, replicas=spec.dp, spec=spec,
                       defaulted=defaulted)  # fmt: skip


def _over_cap(spec: ServeSpec) -> list[str]:
    """A static batch above the engine's ``max_num_seqs``, which it would not run at once."""
    kind = spec.engine_kind
    if spec.arrival != "together" or spec.batch <= kind.max_seqs:
        return []
    return [
        f"a batch of {spec.batch:,} is above {kind.title}'s max_num_seqs of "
        f"{kind.max_seqs:,}: the engine runs at most that many at once and the rest wait; "
        "priced as one batch as asked (--concurrency or --request-rate applies the cap)"
    ]


def serve_caveats(model: ModelSpec, hw: Hardware) -> list[str]:
    """The regimes of known larger error: a routed (MoE) model, a datasheet-only device."""
    out = []
    if ffn.routes(model):
        out.append(_moe_text())
    if hw.calibration.get("basis", "datasheet") == "datasheet":
        out.append(f"{hw.name}: {calibration_line(hw, pointer=False)}; no fitted rate is "
                   "checked on it, so expect larger errors")  # fmt: skip
    elif hw.name not in SERVED_ON:
        out.append(f"{hw.name}: no published serving run checks serving on it (the serving "
                   f"corpus is on {', '.join(SERVED_ON)}); its training calibration is "
                   "what prices it, so expect larger errors")  # fmt: skip
    return out


def moe_serving_figures() -> dict:
    """The published MoE serving runs' figures (``validate.published --loso``): runs,
    sources, and the leave-one-source-out median, low and high error."""
    part = fitted()[SERVING_RECORD].figures["moe"]
    return {"runs": part["runs"], "sources": part["sources"], **part["loso"]}


def _moe_text() -> str:
    f = moe_serving_figures()
    of = f"{f['sources']} source{'s' * (f['sources'] != 1)}"
    return (
        f"mixture-of-experts serving is less certain: on {f['runs']} published MoE serving "
        f"runs of {of} the predicted figure is off by {f['median']:.0%} at the median, from "
        f"{f['low']:+.0%} to {f['high']:+.0%}, with the serving parameters refitted without "
        "each source (python -m validate.published --loso); experts are read as uniform "
        "routing reaches them"
    )
