"""Published training runs as costmodel specs, and what each run measured, per GPU.

``data/runs.json`` is ``shared/published-runs/runs.json`` (66 runs, 6 sources; fields and
conventions in that folder's README) with the fields of :mod:`validate.published.fields`
added: what each source states in costmodel's terms (framework, kernels, recomputation,
dropout, the FLOP convention and peak behind a quoted TFLOP/s or MFU, the line rate it
states), each value the source leaves unstated filled from the paper or repository the
run comes from and cited in the run's ``assumptions``, never a number fitted to the run.
``holdout.json`` and ``holdout_moe.json`` carry the same fields. :func:`case_of` maps one
run to a ModelSpec, TrainSpec, ParallelSpec and Hardware and its measurement to tokens/s
per GPU and memory per GPU (bytes); it reads fields only, so a runs file from anywhere in
the same schema maps the same way, with generic defaults where it is silent. Torch-free.

Converting a quoted TFLOP/s or MFU back to tokens/s uses the FLOPs the source counts
(``flops_convention``; the README's first convention):

- ``model``: Megatron-Core's ``num_floating_point_operations`` (megatron/training/
  training.py, 2024), ``12·s·l·h²·((1 + g/a + s/h)·q/h + gate·F/h + V/(2·l·h))``, equal to
  ``72·s·l·h²·(1 + s/(6h) + V/(12·l·h))`` for GPT (Korthikanti et al. 2022, Sec. 6.3);
- ``narayanan-2021``: Narayanan et al. 2021, Sec. 5.1, ``96·s·l·h²·(1 + s/(6h) +
  V/(16·l·h))``, which counts the recomputed forward.
- ``palm``, ``palm-causal``, ``six-n``: PaLM's App. B count as MaxText's
  ``calculate_training_tflops`` ran it when a table was posted, ``6·N·s`` over every
  parameter plus 12, 6 or 0 x ``H·L·d_h·s²`` for attention (``validate.published.conventions``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from costmodel import (
    Hardware,
    ModelSpec,
    ParallelSpec,
    SpecError,
    TrainSpec,
    get_hardware,
    get_model,
)
from costmodel.catalog.files import read_json
from costmodel.catalog.hardware import resolve_device
from costmodel.specs.frameworks import fixed_stage
from validate.published.conventions import FLOP_CONVENTIONS, flops_per_sequence
from validate.published.fields import MEASURED_RATES, CorpusError, RunFields

__all__ = ["Case", "CorpusError", "case_of", "load_runs", "run_label"]

GiB = 2**30
ARCHITECTURE = ("ffn", "norm", "bias", "tied", "pos", "qkv_bias", "qk_norm", "parallel_block")
"""The ModelSpec keywords ``model.architecture`` may set (the first five said in every
shipped run)."""
_RECOMPUTE = (("full", "full"), ("selective", "selective"))
_PRECISION = (("fp8", "fp8"), ("fp16", "fp16-mixed"))
_PARALLEL_PATHS = {k: f"parallelism.{k}" for k in ("dp", "fsdp", "tp", "pp", "cp", "ep")}
_PARALLEL_PATHS["pp_interleave"] = "parallelism.vpp"
_PARALLEL_PATHS.update(
    {
        k: f"parallelism.{k}"
        for k in (
            "ep_dispatcher",
            "ep_overlap",
            "ep_routing",
            "pp_split_embedding",
            "pp_split_loss",
            "capacity_factor",
            "capacity_pad",
            "pp_schedule",
        )
    }
)
_PARALLEL_PATHS.update({k: k for k in ("expert_gemm", "cuda_graphs")})


@dataclass(frozen=True)
class Case:
    """One published run as specs, with its measurement per GPU."""

    id: str
    group: str
    model: ModelSpec
    train: TrainSpec
    parallel: ParallelSpec
    hardware: Hardware
    measured: dict[str, float]
    """``tokens_per_s_per_gpu`` and, where reported, ``memory_bytes_per_gpu``."""
    assumptions: tuple[str, ...] = field(default=())
    source: str = ""

    @property
    def n_gpus(self) -> int:
        return self.parallel.devices


def default_runs_path() -> Path:
    return Path(str(resources.files("validate.published").joinpath("data/runs.json")))


def load_runs(path: str | Path | None = None) -> list[Any]:
    """The runs of a corpus file (``{"runs": [...]}`` or a list)."""
    try:  # a regular file only (a FIFO would block), nesting and size bounded
        data = read_json(Path(path or default_runs_path()), "runs", limit=256 * 2**20)
    except SpecError as err:
        raise CorpusError(str(err)) from None
    runs = data.get("runs") if isinstance(data, dict) else data
    if not isinstance(runs, list):
        raise CorpusError("runs: expected a list of runs or an object with 'runs'")
    ids = [run_label(r)[0] for r in runs]
    twice = sorted({i for i in ids if ids.count(i) > 1 and i != "?"})
    if twice:
        raise CorpusError(f"runs: each id once (twice or more: {', '.join(twice[:5])})")
    return runs


def run_label(run: Any) -> tuple[str, str]:
    """A run's id and group as a report shows them ("?" where absent or not text)."""
    fields = run if isinstance(run, dict) else {}
    rid, group = fields.get("id"), fields.get("group")
    return (rid if isinstance(rid, str) else "?"), (group if isinstance(group, str) else "?")


def corpus_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options every published-runs command takes: ``--runs FILE`` and ``--out DIR``."""
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--runs", help="corpus JSON (default: the packaged copy of "
                        "shared/published-runs/runs.json)")  # fmt: skip
    parser.add_argument("--out", default="published-results", help="output folder")
    return parser


def open_corpus(args: argparse.Namespace) -> tuple[list[Any], Path]:
    """The runs of ``--runs`` and the ``--out`` folder, created (CorpusError if either fails)."""
    runs = load_runs(args.runs)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CorpusError(f"out: cannot create {out}: {err.strerror or err}") from None
    return runs, out


def case_of(run: Any) -> Case:
    """The specs of one run and its measurement per GPU; CorpusError naming the run and
    the field when a needed field is missing or bad."""
    notes: list[str] = []
    f = RunFields(run, notes)
    notes.extend(f.texts("assumptions"))
    hardware = _hardware(f)
    model = _model(f)
    train, parallel = _layout(f, model)
    measured = _measured(f, model, train, hardware)
    return Case(
        id=f.id,
        group=run_label(run)[1],
        model=model,
        train=train,
        parallel=parallel,
        hardware=hardware,
        measured=measured,
        assumptions=tuple(notes),
        source=_source(run.get("source")),
    )


def _source(src: Any) -> str:
    if isinstance(src, dict):
        return " ".join(str(src[k]) for k in ("repo", "path", "table") if src.get(k))
    return src if isinstance(src, str) else ""


def _spec(f: RunFields, build: Callable[..., Any], paths: dict[str, str], **kwargs: Any) -> Any:
    """A spec built from run fields; its SpecError names the run field it came from."""
    try:
        return build(**kwargs)
    except SpecError as err:
        f.fail(paths.get(err.field, err.field), err.message)
    except (TypeError, ValueError) as err:  # a check that names no field
        f.fail(paths.get("", build.__name__), str(err))


def _own_stage(framework: str, fsdp: int) -> dict[str, int]:
    """The ZeRO stage of a framework that shards its own way, as ``costmodel.inputs``
    states it for the CLI (``fixed_stage``); none for the others."""
    try:
        own = fixed_stage(framework, fsdp)
    except SpecError:
        return {}  # an unknown framework: ParallelSpec names it
    return {} if own is None else {"zero": own}


def _hardware(f: RunFields) -> Hardware:
    """The catalog device the run's ``hardware`` names, with the inter-node line rate it
    states per node (``network_gbps_per_node``) in place of the catalog's (a DGX's NICs)."""
    text = f.text("hardware")
    try:
        hw = get_hardware(resolve_device(text))
    except SpecError as err:
        f.fail("hardware", err.message)
    if f.has("network_gbps_per_node"):
        gbps = f.number("network_gbps_per_node")
        per_gpu = gbps * 1e9 / 8 / hw.devices_per_node
        if per_gpu != hw.network_bw:
            f.notes.append(f"network {gbps:g} Gb/s per node as stated: "
                           f"{per_gpu / 1e9:g} GB/s per GPU")  # fmt: skip
            hw = dataclasses.replace(hw, network_bw=per_gpu)
    return hw


def _model(f: RunFields) -> ModelSpec:
    if f.has("model.preset"):  # an architecture costmodel ships (from its config.json)
        name = f.text("model.preset")
        try:
            model = get_model(name)
        except ValueError as err:
            f.fail("model.preset", str(err))
        f.notes.append(f"architecture: costmodel's {name} preset")
        return model
    d, heads = f.count("model.d_model"), f.count("model.n_heads")
    name = f.raw("model.name")
    paths = {k: f"model.architecture.{k}" for k in ARCHITECTURE}
    return _spec(
        f,
        ModelSpec,
        {**paths, "max_positions": "model.seq"},
        name=name if isinstance(name, str) else f.id,
        vocab=f.count("model.vocab"),
        d_model=d,
        n_layers=f.count("model.n_layers"),
        n_heads=heads,
        n_kv_heads=f.count("model.n_kv_heads", heads),
        d_ff=f.count("model.d_ff", 4 * d),
        max_positions=f.count("model.seq"),
        **_architecture(f),
        **_optional_sizes(f),
    )


OPTIONAL_SIZES = ("head_dim", "n_experts", "experts_per_token", "d_ff_expert",
                  "n_shared_experts", "dense_layers", "q_lora_rank", "kv_lora_rank",
                  "rope_head_dim", "v_head_dim", "sliding_window", "global_every")  # fmt: skip
"""ModelSpec sizes a run without a preset may state under their own names (experts, MLA,
windows); those left out take ModelSpec's defaults (none of them: dense, no MLA)."""


def _optional_sizes(f: RunFields) -> dict[str, int]:
    out = {}
    for key in OPTIONAL_SIZES:
        value = f.raw(f"model.{key}")
        if value is None:
            continue
        integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not integral or value < 0:
            f.fail(f"model.{key}", f"expected a non-negative integer (got {value!r})")
        out[key] = int(value)
    return out


def _architecture(f: RunFields) -> dict[str, Any]:
    """``model.architecture`` as ModelSpec keywords; those left out take ModelSpec's
    defaults (the reference model), said once in the notes."""
    arch = f.raw("model.architecture")
    if arch is None:
        f.default("model.architecture", "SwiGLU, RMSNorm, no biases, untied, RoPE",
                  "costmodel's reference model")  # fmt: skip
        return {}
    if not isinstance(arch, dict):
        f.fail("model.architecture", f"expected an object (got {arch!r})")
    unknown = sorted(set(arch) - set(ARCHITECTURE))
    if unknown:
        f.fail(f"model.architecture.{unknown[0]}", f"not one of {', '.join(ARCHITECTURE)}")
    left = [k for k in ARCHITECTURE[:5] if k not in arch]
    if left:
        f.default(f"model.architecture.{'/'.join(left)}", "ModelSpec's defaults",
                  "costmodel's reference model")  # fmt: skip
    return dict(arch)


def _by_prefix(text: str, table: tuple[tuple[str, str], ...], default: str) -> str:
    """The value of the first prefix the source's wording starts with."""
    text = text.lower()
    return next((value for prefix, value in table if text.startswith(prefix)), default)


def _layout(f: RunFields, model: ModelSpec) -> tuple[TrainSpec, ParallelSpec]:
    tp, pp, cp, fsdp, ep = (f.degree(k) for k in ("tp", "pp", "cp", "fsdp", "ep"))
    n = f.count("n_gpus")
    if n % (tp * pp * cp * fsdp):
        f.fail("n_gpus", f"{n} is not a multiple of fsdp*tp*pp*cp = {tp * pp * cp * fsdp}")
    dp = n // (tp * pp * cp * fsdp)
    if f.has("parallelism.dp") and f.count("parallelism.dp") != dp:
        f.fail("parallelism.dp", f"{f.raw('parallelism.dp')} but n_gpus gives {dp}")
    micro, batch = f.count("micro_batch"), f.count("global_batch")
    if batch % (micro * dp * fsdp):
        f.fail("global_batch", f"{batch} is not a multiple of micro_batch*dp*fsdp = "
               f"{micro * dp * fsdp}")  # fmt: skip
    train = _train(f, batch, grad_accum=batch // (micro * dp * fsdp))
    parallel = _spec(
        f,
        ParallelSpec,
        _PARALLEL_PATHS,
        framework=f.text("framework"),
        **_own_stage(f.text("framework"), fsdp),
        **{k: f.text(k) for k in ("expert_gemm", "cuda_graphs") if f.has(k)},
        grad_reduce_fp32=f.flag("grad_reduce_fp32"),
        async_tp=f.flag("async_tp"),
        dp=dp,
        fsdp=fsdp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        pp_interleave=f.degree("vpp"),
        sequence_parallel=f.flag("sequence_parallel", tp > 1),
        etp=f.count("parallelism.etp") if f.has("parallelism.etp") else None,
        **{
            k: f.count(f"parallelism.{k}")
            for k in ("mx", "my", "slices")
            if f.has(f"parallelism.{k}")
        },  # a TPU run's mesh: ICI axes and slices
        **{
            k: f.flag(f"parallelism.{k}")
            for k in ("pp_split_embedding", "pp_split_loss")
            if f.has(f"parallelism.{k}")
        },  # the embedding and loss counted as layers in the pipeline split
        **(
            {"pp_schedule": f.text("parallelism.pp_schedule")}
            if f.has("parallelism.pp_schedule")
            else {}
        ),  # a schedule other than (interleaved) 1F1B: DualPipe
        **(_expert_fields(f) if ep > 1 else {}),
        **_capacity(f),
    )
    return train, parallel


def _capacity(f: RunFields) -> dict[str, Any]:
    """A stated expert capacity (``parallelism.capacity_factor``) and whether the dispatch
    pads every expert to it (``parallelism.capacity_pad``); dropless where none is stated."""
    out: dict[str, Any] = {}
    if f.has("parallelism.capacity_factor"):
        out["capacity_factor"] = f.number("parallelism.capacity_factor", zero=True)
    if f.has("parallelism.capacity_pad"):
        out["capacity_pad"] = f.flag("parallelism.capacity_pad")
    return out


def _expert_fields(f: RunFields) -> dict[str, Any]:
    """How an expert-parallel run dispatches its tokens, how its router spreads them and
    whether it hides the dispatches (combined 1F1B)."""
    routing = f.text("parallelism.ep_routing") if f.has("parallelism.ep_routing") else None
    if routing is None:  # the corpus-wide rule, said: a source's router is a real one
        routing = "random"
        f.notes.append(ROUTING_RULE)
    return {
        "ep_dispatcher": f.text("parallelism.ep_dispatcher", "all-to-all"),
        "ep_routing": routing,
        "ep_overlap": f.flag("parallelism.ep_overlap", False),
    }


ROUTING_RULE = (
    "ep_routing random: each token's experts independent, as a learned router under load "
    "balancing and Megatron-Core's force-balanced benchmarks draw them "
    "(--moe-router-force-load-balancing: random logits); a benchmark gate that routes "
    "otherwise is stated (NeMo AutoModel's FakeBalancedGate: consecutive)"
)
"""What an expert-parallel run that states no routing is taken to route by."""


def _precision(f: RunFields) -> str:
    """The recipe a source's wording names; integer-quantized training (AQT int8 matmuls)
    is refused, not costed as bf16."""
    stated = f.text("precision", "bf16")
    if stated.lower().startswith(("int8", "int4")):
        f.fail("precision", f"{stated.split()[0]} training is not a costmodel precision")
    return _by_prefix(stated, _PRECISION, "bf16-mixed")


def _train(f: RunFields, batch: int, grad_accum: int) -> TrainSpec:
    stated = f.raw("activation_recompute")
    if f.has("recompute") or not isinstance(stated, str):
        recompute = f.text("recompute", "none")
    else:
        recompute = f.default("recompute", _by_prefix(stated, _RECOMPUTE, "none"),
                              f"from activation_recompute {stated!r}")  # fmt: skip
    if f.has("elementwise") or not f.has("torch_compile"):
        elementwise = f.text("elementwise", "eager")
    else:
        elementwise = "fused" if f.flag("torch_compile") else "eager"
    precision = _precision(f)
    return _spec(
        f,
        TrainSpec,
        {"batch": "global_batch", "seq": "model.seq", "precision": "precision"},
        batch=batch,
        seq=f.count("model.seq"),
        precision=precision,
        optimizer="adamw",
        optimizer_impl=f.text("optimizer_impl"),
        attention=f.text("attention"),
        attention_kernel=f.text("attention_kernel"),
        fp8_recipe=f.text("fp8_recipe", "tensorwise", "the scaling the profiles' fp8 rates price")
        if precision == "fp8" or f.has("fp8_recipe")
        else "tensorwise",  # unused without fp8
        elementwise=elementwise,
        dropout=f.number("dropout", zero=True),
        recompute=recompute,
        recompute_every=f.count("recompute_every") if f.has("recompute_every") else 1,
        grad_accum=grad_accum,
    )


def _measured(f: RunFields, model: ModelSpec, train: TrainSpec, hw: Hardware) -> dict[str, float]:
    out: dict[str, float] = {}
    rate = next((k for k in MEASURED_RATES if f.has(f"measured.{k}")), None)
    if rate is None:
        f.fail("measured", f"no measured rate (needs one of {', '.join(MEASURED_RATES)})")
    if rate == "tokens_per_s_per_gpu":
        out[rate] = f.number("measured.tokens_per_s_per_gpu")
    else:
        tflops = f.number("measured.tflops_per_gpu") if rate == "tflops_per_gpu" else None
        if tflops is None:
            mfu = f.number("measured.mfu")
            peak = _mfu_peak(f, hw)
            tflops = mfu * peak / 1e12
            f.notes.append(f"tokens/s from MFU {mfu} x {peak / 1e12:.0f} TFLOP/s")
        convention = f.choice("flops_convention", tuple(FLOP_CONVENTIONS))
        per_seq = flops_per_sequence(convention, model, train.seq)
        out["tokens_per_s_per_gpu"] = tflops * 1e12 / per_seq * train.seq
    if f.has("measured.memory_GiB"):
        out["memory_bytes_per_gpu"] = f.number("measured.memory_GiB") * GiB
    return out


def _mfu_peak(f: RunFields, hw: Hardware) -> float:
    """The FLOP/s a quoted MFU divides by: stated, else the device's dense 16-bit peak."""
    if f.has("mfu_peak_flops"):
        return f.number("mfu_peak_flops")
    peak = hw.peak_flops.get("bf16") or hw.peak_flops.get("fp16")
    if not peak:
        f.fail("mfu_peak_flops", f"missing, and {hw.name} has no 16-bit peak to default to")
    return f.default("mfu_peak_flops", peak, f"{hw.name}'s dense 16-bit peak")
