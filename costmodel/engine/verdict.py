"""What an estimate answers first: does the layout fit, how fast is it, against which peak,
what limits it, and what it assumed.

- :func:`layout_line` says the layout as it is costed: the framework, the sharding in
  effect (DDP when nothing is sharded, ZeRO-1/2/3 over the shard group, FSDP, Megatron's
  distributed optimizer), the degrees with SP, interleaving and ep, recompute and the
  dtype gradients are reduced in. It reads the framework's traits
  (:mod:`costmodel.frameworks.registry`), never its name.
- :func:`verdict` is the rule of :mod:`costmodel.engine.fit` on one estimate with step
  time, tokens/s per device, MFU and its peak (``Hardware.peak`` of the precision's matmul
  dtype), what limits the step (:func:`costmodel.engine.plan.limit_of`) and the
  assumptions. A layout that does not fit gets no MFU, days or cost, and the nearest
  change that fits (:func:`costmodel.engine.nearest.nearest_fit`). Units: bytes, seconds.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from costmodel.engine.caveats import calibration_line, caveats
from costmodel.engine.estimate import Estimate
from costmodel.engine.nearest import nearest_fit
from costmodel.engine.plan import limit_of
from costmodel.frameworks.registry import framework_of
from costmodel.kinds import ffn
from costmodel.parallel.pipeline import schedule_name
from costmodel.single import fp8
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import traits_of
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import TrainSpec
from costmodel.specs.parallel import FRAMEWORKS, ParallelSpec

_DTYPE_OF_BYTES = {4: "fp32", 2: "bf16", 1: "fp8"}


def reduce_dtype(train: TrainSpec, par: ParallelSpec) -> str:
    """The dtype data-parallel gradients travel in (``parallel.communication``): fp32 with
    ``grad_reduce_fp32``, else the compute dtype."""
    if par.grad_reduce_fp32:
        return "fp32"
    name = _DTYPE_OF_BYTES[PRECISIONS[train.precision].activation]
    return "fp16" if name == "bf16" and train.precision.startswith("fp16") else name


def sharding(par: ParallelSpec) -> str:
    """The sharding in effect, from the framework's traits: Megatron's distributed optimizer
    over every data-parallel rank, a ZeRO stage over fsdp, FSDP over fsdp (x cp where the
    framework shards over the cp ranks), or DDP when nothing is sharded."""
    fw = traits_of(par)
    replicas = f", replicated over dp {par.dp} (HSDP)" if par.dp > 1 else ""
    if fw.distributed_optimizer and par.zero == 3 and par.fsdp > 1:
        return f"Megatron-FSDP (ZeRO-3) over fsdp {par.fsdp}{replicas}"
    if fw.distributed_optimizer:
        ranks = par.dp * par.fsdp * par.cp
        if ranks > 1:
            return f"distributed optimizer over {_ranks(par, ranks, 'data-parallel ranks')}"
    elif fw.zero_stages and par.fsdp > 1:
        return f"ZeRO-{par.zero} over fsdp {par.fsdp}{replicas}"
    elif not fw.zero_stages:
        shards = par.fsdp * (par.cp if fw.shards_over_cp else 1)
        if shards > 1:
            over = f"fsdp {par.fsdp} x cp {par.cp}" if shards != par.fsdp else f"{shards}"
            return f"FSDP over {over}{replicas}"
    ranks = par.dp * (1 if fw.shards_over_cp else par.cp)
    if ranks == 1:
        return "nothing sharded"
    return f"DDP over {_ranks(par, ranks, 'replicas')}, nothing sharded"


def _ranks(par: ParallelSpec, ranks: int, noun: str) -> str:
    """``8 replicas``, or where cp ranks are among them (they reduce the same weights'
    gradients but hold other tokens) ``dp 1 x cp 8 = 8 ranks``."""
    if par.cp == 1 or ranks == par.dp * par.fsdp:
        return f"{ranks} {noun}"
    dp = f"dp {par.dp}" + (f" x fsdp {par.fsdp}" if par.fsdp > 1 else "")
    return f"{dp} x cp {par.cp} = {ranks} ranks"


def degrees(par: ParallelSpec) -> str:
    """``dp 4, fsdp 1, tp 8 + SP, pp 2 (interleaved: 2 virtual stages), cp 1, ep 8``."""
    tp = f"tp {par.tp}" + (" + SP" if par.sequence_parallel else "")
    tp += " (async TP)" if par.async_tp else ""
    pp = f"pp {par.pp}"
    name = schedule_name(par)
    if name:
        pp += f" ({name}: two stages per rank{', in a V' * (name == 'DualPipeV')})"
    elif par.pp_interleave > 1:
        pp += f" (interleaved: {par.pp_interleave} virtual stages)"
    counted = [n for n, on in (("embedding", par.pp_split_embedding),
                               ("loss", par.pp_split_loss)) if on]  # fmt: skip
    if counted:
        pp += f" ({' and '.join(counted)} counted as a layer)"
    out = f"dp {par.dp}, fsdp {par.fsdp}, {tp}, {pp}, cp {par.cp}"
    if par.ep > 1 or par.etp != par.tp:
        out += f", ep {par.ep}" + (" (combined 1F1B)" if par.ep_overlap else "")
    if par.etp != par.tp:
        out += f", etp {par.etp} (experts on their own mesh)"
    return out


def layout_line(train: TrainSpec, par: ParallelSpec, hardware: Hardware) -> str:
    """The layout as it is costed, in one line (the gradient reduce's dtype where more than
    one data-parallel rank reduces)."""
    reduce = ""
    if par.dp * par.fsdp * par.cp > 1:
        dtype, own = reduce_dtype(train, par), traits_of(par).reduce_own_default
        reduce = f"gradients reduced in {dtype}{f' ({own})' * (dtype != 'fp32' and bool(own))}; "
    return (
        f"{par.devices} x {hardware.name}: {par.framework}, {sharding(par)}; {degrees(par)}; "
        f"recompute {train.recompute}; {reduce}overlap {par.overlap}"
    )


def framework_words(par: ParallelSpec, defaulted: Collection[str] = ()) -> str:
    """``framework reference (the default: this project's own model ...; --framework picks
    one of ...)`` when the framework was not given, else ``framework megatron``."""
    shown = f"framework {par.framework}"
    if "framework" not in defaulted:
        return shown
    doc = (type(framework_of(par)).__doc__ or "").strip().split("\n")[0].replace("``", "")
    doc = doc[:1].lower() + doc[1:].rstrip(".")
    if traits_of(par).autocast:
        doc += " under torch.autocast: fp32 parameters and residual stream"
    return f"{shown} (the default: {doc}; --framework picks one of {', '.join(FRAMEWORKS)})"


def assumptions(est: Estimate, defaulted: Collection[str] = ()) -> str:
    """Every choice behind the numbers in one line; ``defaulted`` names the inputs that
    were not given (their defaults are said to be defaults)."""
    t, p = est.train, est.parallel
    assert p is not None
    micro = t.batch // p.batch_step(t.grad_accum)
    zero = ""
    if traits_of(p).zero_stages and p.fsdp > 1 and "zero" in defaulted:
        own = traits_of(p).own_default
        zero = (f"; ZeRO-{p.zero} (costmodel's default for a ZeRO framework{'; ' * bool(own)}"
                f"{own}; --zero 1, 2 or 3)")  # fmt: skip
    return (
        f"{framework_words(p, defaulted)}{zero}; {degrees(p)}{_experts(p, defaulted)}"
        f"{_expert_gemms(est, defaulted)}; "
        f"micro-batch {micro} per device x grad-accum {t.grad_accum}; recompute {t.recompute}; "
        f"{_precision(t, defaulted)}; attention {t.attention}"
        f"{f' (kernel {t.attention_kernel})' if t.attention == 'flash' else ''}; "
        f"{t.optimizer}{_tuned(t)}"
    )


def _precision(t: TrainSpec, defaulted: Collection[str]) -> str:
    """The precision, and under fp8 how its GEMM operands are scaled (default said)."""
    if t.precision != "fp8":
        return t.precision
    default = " (default; --fp8-recipe)" if "fp8_recipe" in defaulted else ""
    return f"fp8, {fp8.note(t.fp8_recipe)}{default}"


def _experts(p: ParallelSpec, defaulted: Collection[str]) -> str:
    """How an expert-parallel layout moves its tokens (nothing without ep), defaults said:
    the dispatcher and the router's spread set its sends, combined 1F1B whether they wait."""
    if p.ep == 1:
        return ""
    said = [
        f"dispatcher {p.ep_dispatcher}"
        + (" (default; --ep-dispatcher)" if "ep_dispatcher" in defaulted else ""),
        f"routing {p.ep_routing}"
        + (" (default; --ep-routing)" if "ep_routing" in defaulted else ""),
        _overlap(p),
        _capacity(p),
    ]
    return f"; experts: {', '.join(said)}"


def _expert_gemms(est: Estimate, defaulted: Collection[str]) -> str:
    """How a routed model's expert GEMMs launch (``ParallelSpec.expert_gemm``), which moves
    an MoE step by up to the half its looped GEMMs are priced at (a probe: unsaid)."""
    p = est.parallel
    assert p is not None
    if not ffn.routes(est.model):
        return ""
    loop = p.expert_gemm == "loop" or (p.expert_gemm == "framework" and
                                       traits_of(p).expert_gemm_loop)  # fmt: skip
    how = ("one GEMM per local expert launched from the host (Transformer Engine's "
           "GroupedLinear), at efficiency.grouped of a dense GEMM" if loop else
           "one grouped kernel for all local experts")  # fmt: skip
    said = f"{p.framework}'s default; " if "expert_gemm" in defaulted else ""
    return f"; expert GEMMs: {how} ({said}--expert-gemm {'grouped' if loop else 'loop'})"


def _overlap(p: ParallelSpec) -> str:
    """Whether another micro-batch's compute hides the all-to-alls, and which schedule."""
    name = schedule_name(p)
    if name:
        return f"all-to-alls overlapped ({name}'s forward-backward pairs)"
    return "all-to-alls overlapped (combined 1F1B)" if p.ep_overlap else "all-to-alls exposed"


def _capacity(p: ParallelSpec) -> str:
    """Dropless, or the capacity and whether the dispatch pads every expert to it."""
    if not p.capacity_factor:
        return "dropless"
    padded = ", padded to it (no host sync)" if p.capacity_pad else ""
    return f"capacity {p.capacity_factor:g}x the mean{padded}"


def _tuned(t: TrainSpec) -> str:
    """A fine-tuning's adapters, in the assumptions line (nothing for full training)."""
    if t.finetune == "full":
        return ""
    frozen = "4-bit NF4 frozen weights" if t.finetune == "qlora" else "frozen 16-bit weights"
    return f"; {t.finetune}: rank-{t.lora_rank} adapters on {t.lora_targets}, {frozen}"


def peak_named(train: TrainSpec, hardware: Hardware) -> tuple[str, float]:
    """The peak MFU is against, named: (``bf16 dense peak 989 TFLOP/s``, FLOP/s)."""
    dtype = PRECISIONS[train.precision].peak_dtype
    flops = hardware.peak(dtype)
    return f"{dtype} dense peak {rate_words(flops)}", flops


def rate_words(flops: float) -> str:
    """A peak in words: ``989 TFLOP/s``, or ``396 GFLOP/s`` below 10 TFLOP/s (a CPU)."""
    return f"{flops / 1e12:,.0f} TFLOP/s" if flops >= 1e13 else f"{flops / 1e9:,.0f} GFLOP/s"


def verdict(
    est: Estimate,
    headroom: float | None = None,
    budget: float | None = None,
    *,
    defaulted: Collection[str] = (),
    nearest: bool = True,
    notes: Collection[str] = (),
    planner: bool = True,
) -> dict[str, Any]:
    """The answer first, as a JSON-ready dict: ``fits``, ``memory`` (the rule's numbers),
    ``summary``; when it fits, step time, tokens/s per device, MFU with its peak, what
    limits the step and (when asked) days and cost; when not, ``nearest_fit`` (or None;
    ``planner`` False: without the planner's search); then ``layout``, ``assumptions``,
    ``calibration`` (what the device's numbers rest on), ``caveats``
    (:mod:`costmodel.engine.caveats`: regimes of known error) and the ``notes`` of the
    setup (defaults it took as the framework would, a pipeline's bubble warning:
    ``costmodel.inputs.Setup.notes``)."""
    fit = est.fit(headroom, budget)
    assert est.parallel is not None and est.hardware is not None
    v = est.values
    out: dict[str, Any] = {"fits": fit.fits, "summary": fit.sentence(), "memory": fit.to_dict()}
    if fit.fits:
        named, flops = peak_named(est.train, est.hardware)
        out.update(step_s=v["time_s.step"],
                   tokens_per_s_per_device=v["tokens_per_s"] / est.parallel.devices,
                   mfu=v["mfu"], mfu_peak=named, mfu_peak_flops=flops,
                   limited_by=limit_of(v, fit.budget_bytes))  # fmt: skip
        out.update({k: v[k] for k in ("train_days", "train_cost") if k in v})
        if "train_days" in v:  # what the days and cost are of (the inputs, as numbers)
            out["train_tokens"] = v["train_days"] * 86400 * v["tokens_per_s"]
            hours = v["train_days"] * 24 * est.parallel.devices
            if "train_cost" in v and hours:
                out["price_per_device_hour"] = v["train_cost"] / hours
    elif nearest:
        out["nearest_fit"] = nearest_fit(est, headroom, budget, planner)
    out["layout"] = layout_line(est.train, est.parallel, est.hardware)
    out["assumptions"] = assumptions(est, defaulted)
    out["calibration"] = calibration_line(est.hardware)
    out["caveats"] = caveats(est, skip=() if fit.fits else ("mfu",))
    if notes:
        out["notes"] = list(notes)
    return out
