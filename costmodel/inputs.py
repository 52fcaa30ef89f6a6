"""The front door: flat user inputs (CLI flags, app widgets, URL parameters) -> checked specs.

``INPUTS`` lists every input once: key, type, default, choices, section and help, the spec
fields read from the dataclasses themselves. ``build(values)`` turns a flat dict of them
into a :class:`Setup`; the CLI and the app both call it, so their defaults and error
messages are the same. A value of ``None`` means "not given". Errors are
:class:`~costmodel.specs.checks.SpecError`; ``section_of(err.field)`` says which group of
inputs it is about.

With a device count, what is not given is taken as the named framework runs it, and said
in ``Setup.notes``: the data-parallel devices fill what the other degrees leave, as one
shard group under the frameworks that shard by default (FSDP2 as torchtitan applies it,
``dp_shard = -1``; DeepSpeed's ZeRO over its data-parallel group; the hand-written FSDP),
as replicas otherwise; and one sequence per device per micro-batch, the rest of the batch
as gradient accumulation (NeMo's Llama 3 pretraining recipes, ``micro_batch_size=1``),
where the batch divides over the replicas. A pipeline with fewer micro-batches than
stages is warned of.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from costmodel.catalog.hardware import HARDWARE, get_hardware
from costmodel.catalog.hf import model_from_hf_config
from costmodel.catalog.presets import PRESETS, get_model
from costmodel.config import check
from costmodel.engine.estimate import Estimate, estimate
from costmodel.engine.notes import layout_notes, placement_notes, seq_note, unused_notes
from costmodel.engine.verdict import verdict
from costmodel.single import fp8
from costmodel.single.precision import PRECISIONS
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.frameworks import trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import (
    ModelSpec,
    TrainSpec,
    choices_of,
    field_docs,
)
from costmodel.specs.parallel import ParallelSpec, fill_dp, grad_accum_of
from costmodel.specs.rules import MAX_BATCH

SECTIONS = ("model", "training", "cluster", "cost")


@dataclass(frozen=True)
class Input:
    """One user input."""

    key: str
    kind: type
    """int, float, bool or str."""
    default: Any
    """None: not given (a preset's value, or the spec's rule, applies)."""
    section: str
    choices: tuple[Any, ...] | None = None
    help: str = ""


def _spec_inputs(cls: type, section: str, *, no_defaults: bool = False) -> list[Input]:
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if f.name == "name":
            continue
        choices = choices_of(cls, f.name)
        kind = type(choices[0]) if choices else hints[f.name]
        kind = {int | None: int, bool | None: bool}.get(kind, kind)
        default = None if no_defaults or f.default is MISSING else f.default
        out.append(Input(f.name, kind, default, section, choices, docs.get(f.name, "")))
    return out


FRONT = {
    "model": Input("model", str, None, "model", tuple(PRESETS), "a preset"),
    "hf_config": Input("hf_config", str, None, "model", None, "a Hugging Face config.json"),
    "hardware": Input(
        "hardware", str, None, "cluster", None, f"{', '.join(HARDWARE)}, or a profile .json"
    ),
    "gpus": Input("gpus", int, None, "cluster", None, "devices; dp fills what the others leave"),
    "microbatch": Input(
        "microbatch", int, None, "training", None,
        "sequences per device per micro-batch (sets grad_accum)",
    ),
    "token_budget": Input("token_budget", float, None, "cost", None, "tokens to train on"),
    "price_per_hour": Input("price_per_hour", float, None, "cost", None, "per device-hour"),
}  # fmt: skip

MODEL_INPUTS = tuple(_spec_inputs(ModelSpec, "model", no_defaults=True))
TRAIN_INPUTS = tuple(
    dataclasses.replace(i, default=None) if i.key == "grad_accum" else i  # unset: from the
    for i in _spec_inputs(TrainSpec, "training")  # micro-batch, as frameworks derive it
)
PARALLEL_INPUTS = tuple(_spec_inputs(ParallelSpec, "cluster"))
INPUTS: tuple[Input, ...] = (
    FRONT["model"],
    FRONT["hf_config"],
    *MODEL_INPUTS,
    *TRAIN_INPUTS,
    FRONT["microbatch"],
    FRONT["hardware"],
    FRONT["gpus"],
    *PARALLEL_INPUTS,
    FRONT["token_budget"],
    FRONT["price_per_hour"],
)
BY_KEY: dict[str, Input] = {i.key: i for i in INPUTS}


def section_of(field: str) -> str:
    """The input section a SpecError's field belongs to (``cluster`` for layout words)."""
    head = field.split(".")[0]
    if head in BY_KEY:
        return BY_KEY[head].section
    return "cluster"


@dataclass(frozen=True)
class Setup:
    """Checked specs of one question."""

    model: ModelSpec
    train: TrainSpec
    parallel: ParallelSpec | None = None
    hardware: Hardware | None = None
    token_budget: float | None = None
    price_per_hour: float | None = None
    notes: tuple[str, ...] = ()
    """What the setup chose for the user, or warns of (defaults a framework would take)."""

    def estimate(self) -> Estimate:
        return estimate(
            self.model,
            self.train,
            self.parallel,
            self.hardware,
            token_budget=self.token_budget,
            price_per_hour=self.price_per_hour,
        )


def _given(values: Mapping[str, Any], inputs: tuple[Input, ...]) -> dict[str, Any]:
    return {i.key: values[i.key] for i in inputs if values.get(i.key) is not None}


def build_model(values: Mapping[str, Any], model: ModelSpec | None = None) -> ModelSpec:
    """The model: ``model`` (e.g. an upload), a HF config, a preset, or the sizes given;
    model fields in ``values`` override it."""
    overrides = _given(values, MODEL_INPUTS)
    if model is not None:
        return model.replace(**overrides)
    if values.get("hf_config") is not None:
        return model_from_hf_config(values["hf_config"]).replace(**overrides)
    if values.get("model") is not None:
        return get_model(values["model"], **overrides)
    required = [f.name for f in fields(ModelSpec) if f.default is MISSING]
    missing = [n for n in required if n not in overrides]
    if missing:
        raise SpecError("model", f"without model or hf_config, give {', '.join(missing)}")
    return ModelSpec(**overrides)


def _adapter_inputs(values: Mapping[str, Any], train: TrainSpec) -> None:
    """The adapters' rank and targets only where adapters are trained (as recompute_every
    needs recompute full): given under full fine-tuning they would change nothing."""
    given = [k for k in ("lora_rank", "lora_targets") if values.get(k) is not None]
    if given and train.finetune == "full":
        raise SpecError(given[0], f"{given[0]} sets the LoRA adapters: it needs finetune "
                        "lora or qlora (got finetune full)")  # fmt: skip


def _check_budget(budget: float, train: TrainSpec) -> None:
    """A token budget is at least one step's tokens (a smaller one trains nothing: its days
    and cost would read as a run's)."""
    checks.number("token_budget", budget)
    checks.at_most("token_budget", budget, f"{10**18:,}", 10**18, "tokens (tens of "
                   "thousands of times the largest published training runs')")  # fmt: skip
    step = train.batch * train.seq
    if budget < step:
        raise SpecError("token_budget", f"token_budget ({budget:,.6g} tokens) is less than one "
                        f"step's {step:,} tokens ({train.batch} sequences of {train.seq:,}): "
                        "give at least one step's tokens, or leave it out")  # fmt: skip


def build(
    values: Mapping[str, Any], model: ModelSpec | None = None, *, solving: str | None = None
) -> Setup:
    """Checked specs from flat inputs; unknown keys are an error. ``solving`` names the
    field an inverse question solves for (``batch`` or ``seq``): it takes the smallest
    value the layout allows instead of its input."""
    unknown = sorted(k for k in values if k not in BY_KEY)
    if unknown:
        raise SpecError(unknown[0], f"unknown input(s): {', '.join(unknown)}")
    spec = build_model(values, model)
    given = _given(values, TRAIN_INPUTS)
    if solving == "batch" and "batch" not in given and "grad_accum" in given:
        given["batch"] = given["grad_accum"]  # a start the accumulation divides (not solved)
    train = TrainSpec(**given)
    _adapter_inputs(values, train)
    budget, price = values.get("token_budget"), values.get("price_per_hour")
    if price is not None:
        checks.number("price_per_hour", price, allow_zero=True)
        checks.at_most("price_per_hour", price, f"{10**6:,}", 10**6, "per device-hour")
    if budget is not None:
        _check_budget(budget, train)
    layout = _given(values, PARALLEL_INPUTS)
    if values.get("hardware") is None:
        priced = ("gpus", "microbatch", "token_budget", "price_per_hour")  # each needs a device
        asked = [*layout, *(k for k in priced if values.get(k))]
        if asked:
            raise SpecError("hardware", f"hardware is required with {', '.join(asked)}")
        if values.get("grad_accum") is None:  # one replica, one sequence per micro-batch
            train = train.replace(grad_accum=train.batch)
        check(spec, train)
        notes = layout_notes(train, ParallelSpec(), micro_default=values.get("grad_accum") is None,
                       shard_default=False)  # fmt: skip
        return Setup(spec, train, notes=(*seq_note(values, spec, train, solving), *notes))
    parallel = _parallel(layout, values.get("gpus"))
    if solving == "batch":
        micro = values.get("microbatch") or 1
        train = train.replace(batch=parallel.batch_step(train.grad_accum) * micro)
    elif solving == "seq":
        train = train.replace(seq=parallel.seq_step())
    batch_default = values.get("batch") is None and solving != "batch"
    train = _default_batch(train, parallel) if batch_default else train
    if values.get("gpus") is not None and "dp" not in layout and not values.get("grad_accum"):
        _splits_over_gpus(train.batch, parallel, values["gpus"])
    accum_given = values.get("grad_accum") is not None
    micro = values.get("microbatch")
    if micro is None and not accum_given:  # as frameworks run by default (module doc)
        micro = 1 if train.batch % (parallel.dp * parallel.fsdp) == 0 else None
    train = _micro_batch(train, parallel, micro, accum_given)
    check(spec, train, parallel)
    hardware = get_hardware(values["hardware"])
    if hardware.kind == "tpu" and trait(parallel.framework, "cuda_only"):
        raise SpecError("framework", f"{parallel.framework} runs on CUDA GPUs, not on "
                        f"{hardware.name}: on a TPU price --framework fsdp2 (MaxText's FSDP, "
                        "as the TPU runs the catalog checks)")  # fmt: skip
    hardware.peak(PRECISIONS[train.precision].peak_dtype)  # the device has the precision
    if train.attention == "flash":  # ... and a rate for the attention kernel named
        hardware.attention_peak(PRECISIONS[train.precision].attention_peak_dtype,
                                train.attention_kernel)  # fmt: skip
    fp8.check_device(train.fp8_recipe, train.precision, hardware)  # ... and its fp8 scales
    notes = layout_notes(train, parallel, micro_default=values.get("microbatch") is None and not
                   accum_given, shard_default="fsdp" not in layout and "dp" not in layout,
                   batch_default=batch_default)  # fmt: skip
    notes = (*seq_note(values, spec, train, solving), *notes)
    notes = (*notes, *placement_notes(spec, parallel, hardware))
    notes = (*notes, *unused_notes(values, train, parallel, price if not budget else None))
    return Setup(spec, train, parallel, hardware, budget, price if budget else None, notes)


def _parallel(layout: dict[str, Any], gpus: int | None) -> ParallelSpec:
    parallel = ParallelSpec(**layout)  # an unset zero is the framework's own stage
    if gpus is None:
        return parallel
    checks.integer("gpus", gpus)
    stage = layout.get("zero") if trait(parallel.framework, "zero_stages") else None
    if "dp" not in layout:  # the framework's own split: replicas, or one shard group
        # a ZeRO stage asked for shards over every data-parallel device (DeepSpeed's own)
        sharding = trait(parallel.framework, "shards_by_default") or bool(stage)
        return _sharded_somewhere(
            fill_dp(parallel, gpus, shard="fsdp" not in layout and sharding), stage
        )
    if parallel.devices != gpus:
        raise SpecError("gpus", "dp * fsdp * tp * pp * cp must equal gpus (got "
                        f"{parallel.devices} and gpus={gpus})")  # fmt: skip
    return _sharded_somewhere(parallel, stage)


def _splits_over_gpus(batch: int, parallel: ParallelSpec, gpus: int) -> None:
    """A batch the data-parallel devices ``--gpus`` leaves do not divide, refused naming
    the inputs the user gave (dp, the field, was filled from gpus: the app mends it with
    the batch or the GPUs) and the nearest batches that split."""
    ranks = parallel.dp * parallel.fsdp
    if batch % ranks == 0:
        return
    lower, upper = batch // ranks * ranks, (batch // ranks + 1) * ranks
    nearest = f"{lower:,} or {upper:,}" if lower else f"{upper:,}"
    raise SpecError("dp", f"batch {batch:,} does not split over the {ranks:,} "
                    f"data-parallel devices of gpus {gpus:,} (dp x fsdp = {ranks:,}): "
                    f"give batch {nearest}, or gpus whose data-parallel devices divide "
                    f"{batch:,}")  # fmt: skip


def _sharded_somewhere(parallel: ParallelSpec, stage: int | None) -> ParallelSpec:
    """A ZeRO stage the user asked for must shard something: over fsdp ranks (ZeRO's
    group); fsdp 1 beside dp replicas would silently shard nothing."""
    if stage and parallel.fsdp == 1 and parallel.dp > 1:
        raise SpecError("zero", f"zero {stage} shards over the fsdp ranks and fsdp is 1: "
                        f"nothing would be sharded; give --fsdp (e.g. --fsdp {parallel.dp} "
                        "--dp 1 for ZeRO over every data-parallel rank)")  # fmt: skip
    return parallel


def _default_batch(train: TrainSpec, par: ParallelSpec) -> TrainSpec:
    """A batch not given (:func:`default_batch`); one over what a step may hold is said of
    the devices that took it, not of a batch the user never gave."""
    batch = default_batch(train.batch, par.dp * par.fsdp)
    if batch > MAX_BATCH:
        raise SpecError("gpus", f"{par.dp * par.fsdp:,} data-parallel devices would take a "
                        f"default batch of {batch:,} (one sequence each), over the "
                        f"{MAX_BATCH:,} a step may hold: give fewer gpus")  # fmt: skip
    return train.replace(batch=batch)


def default_batch(batch: Any, ranks: Any) -> Any:
    """``batch`` where it divides over the ``ranks`` data-parallel devices, else the
    smallest multiple of them above it (one sequence per device); numbers or arrays."""
    return -(-batch // ranks) * ranks


def _micro_batch(train: TrainSpec, par: ParallelSpec, micro: int | None, accum_given: bool):
    """grad_accum from the micro-batch: batch = dp · fsdp · micro-batch · grad_accum. A
    grad_accum given too must agree."""
    if micro is None:
        return train
    checks.integer("microbatch", micro)
    ranks = par.dp * par.fsdp
    if train.batch % (micro * ranks):  # in the user's words: the devices, not dp and fsdp
        fit = [m for m in range(1, train.batch // ranks + 1) if train.batch % (m * ranks) == 0]
        way = (f"give microbatch {' or '.join(map(str, fit[-3:]))}" if fit else
               f"batch {train.batch} does not split over the {ranks} devices at all")  # fmt: skip
        raise SpecError("microbatch", f"microbatch {micro} x the {ranks} data-parallel devices "
                        f"({micro * ranks}) must divide batch {train.batch}: {way}")  # fmt: skip
    accum = grad_accum_of(train.batch, par.dp, par.fsdp, micro, field="microbatch")
    if accum_given and accum != train.grad_accum:
        raise SpecError(
            "microbatch",
            f"microbatch and grad_accum disagree (microbatch={micro} gives grad_accum="
            f"{accum}, got grad_accum={train.grad_accum})",
        )
    return train.replace(grad_accum=accum)


SOLVED = {"batch": ("batch", "microbatch"), "seq": ("seq",)}
"""What ``solve max-batch`` and ``max-seq`` solve for: not inputs of the question."""


def refuse_solved(field: str, given: Mapping[str, Any], name: Any = str) -> None:
    """``max-batch`` grows the micro-batch per device, ``max-seq`` the sequence: a value given
    for what it solves is refused, naming it (``name`` spells it: the CLI's flag)."""
    for key in SOLVED[field]:
        if given.get(key) is not None:
            why = "it grows the micro-batch per device" if field == "batch" else "its length"
            raise SpecError(key, f"max-{field} solves for the {field}: drop {name(key)} ({why})")


def solved_verdict(
    est: Estimate, given: Mapping[str, Any], headroom: float | None, budget: float | None
) -> dict[str, Any]:
    """The fit rule's verdict at a solved answer (``solve`` and the API's ``max_seq``,
    ``max_batch``, ``min_fsdp``): the budget the question used, the inputs not in
    ``given`` announced as defaults, no nearest fit (the answer is one)."""
    defaulted = set(BY_KEY) - set(given)
    return verdict(est, headroom, budget, defaulted=defaulted, nearest=False)


API_NAMES = {"micro_batch": "microbatch", "global_batch": "batch", "budget_bytes": "budget_gb",
             "budget": "budget_gb", "devices": "gpus", "micro_batches": "microbatches"}  # fmt: skip
"""Names other APIs use -> the Python API's (the CLI's flags without their dashes); an
error says which to use."""


def keyword_values(model: str | ModelSpec | None, inputs: dict[str, Any]) -> tuple[dict, Any]:
    """The Python API's keywords -> (flat inputs for :func:`build`, a ModelSpec given as an
    object or None); a name of another API is refused with the one to use."""
    for name, cli in API_NAMES.items():
        if name in inputs:
            plan = " (plan's --global-batch)" * (name == "global_batch")
            raise SpecError(name, f"unknown input {name}: the Python name is {cli}{plan}, "
                            "as the CLI's flags without their dashes")  # fmt: skip
    if "model" in inputs or "hf_config" in inputs:
        raise SpecError("model", "give the model as the first argument")
    if isinstance(model, ModelSpec):
        return inputs, model
    if model is not None and not isinstance(model, str):
        raise SpecError("model", f"a preset name or a ModelSpec (got {type(model).__name__})")
    return {**inputs, "model": model}, None


def expert_start(values: Mapping[str, Any]) -> dict[str, Any]:
    """A shard group the layout rules accept for a search over the FSDP degree (``solve
    min-fsdp``): ep x etp ranks where the experts are split (they must divide the data-
    parallel ranks), one sequence each; nothing where they are not. The search then tries
    every degree the rules allow (``engine.inverse.min_fsdp_fitting``)."""
    ranks = (values.get("ep") or 1) * (values.get("etp") or 1)
    return {} if ranks == 1 else {"fsdp": ranks}
