"""What each training framework is, as data: the traits the layout rules, the inputs'
defaults and the formulas read (``Traits``), one entry per framework in :data:`TRAITS`.

A framework's pricing (what each device holds, by position in the step) builds on the
formulas and lives above them (``costmodel.frameworks``); its facts live here, below every
layer that asks them, so a spec can fill a framework's defaults without importing a
formula. Each entry cites the framework's own documentation or source for its values.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Protocol, get_args

import numpy as np

from costmodel.specs import checks
from costmodel.specs.checks import SpecError

FrameworkName = Literal["reference", "fsdp2", "megatron", "deepspeed", "handwritten"]
FRAMEWORKS: tuple[str, ...] = get_args(FrameworkName)


class Traits:
    """One training framework's facts. Traits are class attributes (plain data, also read
    on arrays of names by :func:`trait`); the ZeRO stage it runs, the shardings the planner
    tries and the layouts it refuses are methods, whose defaults are what most do."""

    name: ClassVar[str]
    fsdp_name: ClassVar[str] = "ZeRO-3"
    """What its sharding over fsdp ranks is called (a nearest fit's words)."""
    reshard_option: ClassVar[bool] = False
    """Whether ``reshard_after_forward=False`` is its option (FSDP2's ``fully_shard``), its
    memory priced; the others run their own schedules and refuse it."""
    cuda_only: ClassVar[bool] = False
    """Runs on CUDA GPUs alone (Transformer Engine's and DeepSpeed's kernels): refused on a
    TPU, where the runs the catalog checks are MaxText's FSDP (framework ``fsdp2``)."""
    autocast: ClassVar[bool] = False
    """torch.autocast over fp32 parameters (the reference model): an fp32 residual stream,
    low-precision weight casts kept from forward to backward and their cast traffic."""
    ddp_buckets: ClassVar[bool] = False
    """Gradients reduced by torch DDP's flat buckets (kept for the whole run)."""
    rebuilds_tables: ClassVar[bool] = False
    """RoPE and mask tables made again in every forward (kept per micro-batch in flight)."""
    dtensor_tp: ClassVar[bool] = False
    """Tensor parallelism through torch's DTensor (``parallelize_module``): a vocabulary-
    parallel embedding that keeps extra buffers, sequence-parallel inputs gathered again."""
    torch_pipelining: ClassVar[bool] = False
    """Pipelines through ``torch.distributed.pipelining`` (its receive buffers and caches)."""
    combine_keeps_weighted: ClassVar[bool] = True
    """An MoE layer's combine keeps two copies of each routed pair's output for backward:
    the expert's output and the weighted output (the reference model's ``index_add`` keeps
    its source; torchtitan's weighting, in fp32, keeps its fp32 input: as many bytes).
    False: one, the expert's output (Megatron-Core's unpermute: the fused top-k kernel saves
    its input, row map and probabilities; the unfused product, its expert-output operand)."""
    shards_over_cp: ClassVar[bool] = False
    """The ZeRO group spans the cp ranks too (torchtitan's dp_shard_cp mesh)."""
    distributed_optimizer: ClassVar[bool] = False
    """Megatron's distributed optimizer: optimizer state over every data-parallel rank,
    gradients reduce-scattered and updated parameters all-gathered in buckets."""
    zero3_prefetch: ClassVar[bool] = False
    """Under ZeRO-3, the running layer and the prefetched next one are gathered beside the
    shard (DeepSpeed, the reference model's ZeRO-3)."""
    params_persist: ClassVar[bool | None] = None
    """Working weights held through the step (True), freed after backward (False), or as
    the generic peak rule decides (None)."""
    grads_always_live: ClassVar[bool] = False
    """The gradient buffer is allocated once and never freed (Megatron's grad buffer)."""
    exposes_fsdp: ClassVar[bool] = False
    """Gathers and reduce-scatters run in line with the compute, nothing prefetched."""
    finetunes: ClassVar[bool] = False
    """LoRA and QLoRA are costed under this framework."""
    runs_moe: ClassVar[bool] = True
    """Mixture-of-experts models are costed under this framework."""
    expert_tensor_parallel: ClassVar[bool] = False
    """Runs tensor parallelism on an MoE model, the experts on their own mesh (etp, ep over
    tp x dp: Megatron-Core's expert tensor parallelism and MoE parallel folding)."""
    expert_gemm_loop: ClassVar[bool] = False
    """Its grouped expert linears launch one GEMM per local expert from the host, sized by
    tokens-per-expert counts read back from the device in every MoE layer (Transformer
    Engine's ``GroupedLinear`` takes the splits as a host list), so that host work is
    exposed (``Hardware.expert_call_s`` per launch). False: one grouped kernel reading its
    offsets on the device (torch's ``_grouped_mm``) or an eager loop already counted as
    kernels."""
    module_launches: ClassVar[bool] = False
    """Its fused kernels are launched by Python modules (Megatron-Core's Transformer Engine
    layers: each counted kernel stands for a module's Python and several launches), so a
    step with fused elementwise kernels costs the host ``Hardware.launch_s`` per kernel
    (``costmodel.parallel.host``). False: fused kernels come from torch.compile, whose
    generated code launches them directly; the host costs ``dispatch_s`` per kernel."""
    tp_backward_overlap: ClassVar[bool] = False
    """Under sequence parallelism, the column-parallel linears' backward saves their input
    shard and gathers it again beside the input-gradient GEMM, and reduce-scatters the
    input gradient beside the weight-gradient GEMM (Korthikanti et al. 2022, Sec. 4.2.2;
    Megatron-Core's ``LinearWithGradAccumulationAndAsyncCommunication``, Transformer
    Engine's linears): both hidden, the row-parallel linears' gather of the output
    gradient exposed."""
    combined_1f1b: ClassVar[bool] = False
    """Runs Megatron-Core's combined 1F1B (expert all-to-alls beside another micro-batch)."""
    planned: ClassVar[bool] = True
    """The planner may choose this framework."""
    zero_stages: ClassVar[bool] = False
    """The user picks the ZeRO stage (a layout label names it)."""
    sharding: ClassVar[str] = ""
    """How the framework shards its state where the user does not pick a ZeRO stage, in
    words (what ``--zero`` would contradict)."""
    zero_stage: ClassVar[int] = 3
    """The ZeRO stage the framework runs where the user does not pick one (the planner's
    ``shardings`` use it, and so does every question stated by inputs; :meth:`own_stage`)."""
    own_default: ClassVar[str] = ""
    """Where the framework's own default stage differs from costmodel's ``zero_stage``, in
    words for the assumptions line (DeepSpeed's ``zero_optimization.stage`` is 0)."""
    shards_by_default: ClassVar[bool] = False
    """With no sharding degree stated, the data-parallel devices form one shard group
    (torchtitan's ``dp_shard = -1``; DeepSpeed's ZeRO over its data-parallel group); else
    they are replicas (DDP; Megatron's distributed optimizer shards over them anyway)."""
    reduce_fp32_default: ClassVar[bool] = False
    """Gradients are reduced in fp32 unless told otherwise (torchtitan's
    ``mixed_precision_reduce = "float32"``); the planner's candidates follow it."""
    reduce_own_default: ClassVar[str] = ""
    """Where the framework's own gradient-reduce dtype differs from costmodel's default for
    it, in words for the layout line."""
    pipeline_layout: ClassVar[str] = ""
    """The argument that states a pipeline split whose layers do not divide over its
    stages (Megatron-LM's ``--pipeline-model-parallel-layout``); empty: the framework
    splits them as it chooses (torch's pipelining)."""
    interleaved_rounds: ClassVar[str] = ""
    """What its interleaved schedule does with micro-batches the pipeline ranks do not
    divide, in words (Megatron-Core before ``microbatch_group_size_per_vp_stage`` raised
    "number of microbatches ... is not divisible by pipeline-model-parallel-size"); empty:
    it runs any count."""

    def rules(self, par: Any, model: Any, train: Any, on: Any) -> None:
        """Layouts this framework refuses beyond the shared rules, at the points ``on``
        (a bool or bool array; the fields may be arrays); nothing by default."""

    def own_stage(self, fsdp: int) -> int:
        """The ZeRO stage the framework runs over ``fsdp`` shard ranks where the user picks
        none (``zero_stage``)."""
        return self.zero_stage

    def shardings(self, replicas: int) -> list[tuple[int, int, int]]:
        """(dp, fsdp, zero) of ``replicas`` data-parallel devices the planner tries: ZeRO
        1/2/3 over every replica; over one, nothing shards, so one stage (the framework's
        own: three stages of one device were three identical rows)."""
        if replicas == 1:
            return [(1, 1, self.own_stage(1))]
        return [(1, replicas, z) for z in (1, 2, 3)]

    def most_sharded(self, replicas: int) -> tuple[int, int, int]:
        """The (dp, fsdp, zero) that shards the most over ``replicas`` devices, the nearest
        fit's sharding change: by default the deepest of :meth:`shardings`."""
        return max(self.shardings(replicas), key=lambda s: (s[1], s[2]))


class ReferenceTraits(Traits):
    """This project's own model, as ``validate/`` runs it (``validate/reference/model.py``:
    torch.autocast, torch DDP, ZeRO 1/2/3 over fsdp, DTensor tensor parallelism and
    ``torch.distributed.pipelining``)."""

    name = "reference"
    autocast = True
    reduce_fp32_default = True  # autocast keeps fp32 parameters, so fp32 .grad: DDP and
    # ZeRO reduce them as they are (no compression hook)
    ddp_buckets = True
    rebuilds_tables = True
    dtensor_tp = True
    torch_pipelining = True
    zero3_prefetch = True
    finetunes = True
    zero_stages = True

    def shardings(self, replicas: int) -> list[tuple[int, int, int]]:
        """ZeRO 1/2/3 over every replica, or DDP over them (no sharding)."""
        zero = super().shardings(replicas)
        return [*zero, (replicas, 1, 1)] if replicas > 1 else zero


class FSDP2Traits(Traits):
    """FSDP2 (``fully_shard``) with a bf16 MixedPrecisionPolicy, as torchtitan applies it
    (``dp_shard = -1``: the data-parallel devices form one shard group;
    ``mixed_precision_reduce = "float32"``)."""

    name = "fsdp2"
    fsdp_name = "FSDP2"
    reshard_option = True
    sharding = (
        "FSDP: parameters, gradients and optimizer state over the fsdp ranks (ZeRO-3; "
        "--no-reshard-after-forward keeps the gathered parameters to the backward, as ZeRO-2 does)"
    )
    shards_by_default = True
    dtensor_tp = True
    torch_pipelining = True
    shards_over_cp = True
    params_persist = False
    reduce_fp32_default = True
    expert_tensor_parallel = True  # torchtitan's expert_tensor_parallel_degree: 1 or tp

    def rules(self, par: Any, model: Any, train: Any, on: Any) -> None:
        """The experts are tensor-parallel over the tp ranks or not at all: torchtitan's
        ``expert_tensor_parallel_degree`` is 1 (ep borrows the tp ranks) or tp
        (``torchtitan/config/job_config.py``, ``Parallelism``); MaxText's ``tensor``
        mesh axis shards the experts' hidden dimension as it does the dense MLP's."""
        etp, tp = np.asarray(par.etp), np.asarray(par.tp)
        ok = ~np.asarray(on, dtype=bool) | (etp == 1) | (etp == tp)

        def got() -> str:
            return f"etp={checks._first_bad(ok, etp)[0]}, tp={checks._first_bad(ok, tp)[0]}"

        checks.require(ok, "etp", lambda: "framework=fsdp2 runs the experts tensor-parallel "
                       "over the tp ranks or not at all: etp must be 1 or tp "
                       f"(got {got()})")  # fmt: skip

    def shardings(self, replicas: int) -> list[tuple[int, int, int]]:
        """HSDP: fsdp shards times dp replicas of the shards, every split."""
        return [(replicas // f, f, 3) for f in range(1, replicas + 1) if replicas % f == 0]


class MegatronTraits(Traits):
    """Megatron-Core with the distributed optimizer (Megatron-LM docs, "Distributed
    Optimizer"), Transformer Engine layers, combined 1F1B and expert tensor parallelism."""

    name = "megatron"
    fsdp_name = "Megatron-FSDP"
    cuda_only = True
    sharding = (
        "its distributed optimizer: master weights and optimizer state over the "
        "data-parallel ranks (ZeRO-1 in DeepSpeed's terms), or Megatron-FSDP (ZeRO-3) "
        "over --fsdp ranks"
    )
    zero_stage = 1
    distributed_optimizer = True
    zero3_prefetch = True  # Megatron-FSDP gathers the next layer while one runs
    params_persist = True
    grads_always_live = True
    combined_1f1b = True
    tp_backward_overlap = True
    expert_tensor_parallel = True
    expert_gemm_loop = True
    module_launches = True
    combine_keeps_weighted = False
    reduce_own_default = "as NeMo's performance recipes; Megatron-LM's own default: fp32"
    pipeline_layout = "--pipeline-model-parallel-layout"
    interleaved_rounds = (
        "older Megatron-Core interleaved schedules refuse that count "
        "(current ones run a short last round)"
    )

    def rules(self, par: Any, model: Any, train: Any, on: Any) -> None:
        """An MoE model under tp > 1 needs sequence parallelism (Megatron-Core's
        ``TransformerConfig``: "When using MoE and tensor parallelism, sequence parallelism
        must be used")."""
        moe = np.asarray(getattr(model, "n_experts", 0)) > 0
        tp = np.asarray(par.tp)
        sp_on = np.asarray(par.sequence_parallel, dtype=bool)
        ok = ~np.asarray(on, dtype=bool) | ~moe | (tp == 1) | sp_on
        checks.require(ok, "sequence_parallel", lambda: "a mixture-of-experts model under "
                       "tp > 1 needs sequence_parallel under framework=megatron (Megatron-"
                       "Core: \"When using MoE and tensor parallelism, sequence parallelism "
                       "must be used\")")  # fmt: skip

    def own_stage(self, fsdp: int) -> int:
        """The distributed optimizer's ZeRO-1 over replicas; over fsdp > 1 shard ranks,
        Megatron-FSDP (``--use-megatron-fsdp``), whose default
        ``data_parallel_sharding_strategy`` ``optim_grads_params`` is ZeRO-3."""
        return 3 if fsdp > 1 else self.zero_stage

    def shardings(self, replicas: int) -> list[tuple[int, int, int]]:
        """Data parallelism with the distributed optimizer over every replica."""
        return [(replicas, 1, self.zero_stage)]

    def most_sharded(self, replicas: int) -> tuple[int, int, int]:
        """Megatron-FSDP over every replica (ZeRO-3), which the planner leaves out."""
        return (1, replicas, 3)


class DeepSpeedTraits(Traits):
    """DeepSpeed's ZeRO engine (its stage picked with ``--zero``)."""

    name = "deepspeed"
    cuda_only = True
    shards_by_default = True
    zero3_prefetch = True
    params_persist = True
    zero_stages = True
    own_default = "DeepSpeed's own is stage 0"


class HandwrittenTraits(Traits):
    """``validate/fsdp.py``: ZeRO-3 over fsdp alone, nothing prefetched or overlapped."""

    name = "handwritten"
    sharding = "ZeRO-3 over the fsdp ranks"
    shards_by_default = True
    exposes_fsdp = True
    runs_moe = False
    planned = False

    def rules(self, par: Any, model: Any, train: Any, on: Any) -> None:
        """What ``validate/fsdp.py`` runs: ZeRO-3 over fsdp alone, parameters shared by no
        two modules, every forward op saved (its gathers are modelled without
        recomputation)."""
        off = ~np.asarray(on, dtype=bool)
        for name in ("dp", "tp", "pp", "cp", "ep"):
            degree = np.asarray(getattr(par, name, 1))
            ok = off | (degree == 1)
            checks.require(ok, name, lambda n=name, d=degree, ok=ok: "framework=handwritten "
                           f"shards over fsdp only: {n} must be 1 (got "
                           f"{checks._first_bad(ok, d)[0]})")  # fmt: skip
        checks.require(off | ~np.asarray(model.tied, dtype=bool), "tied", lambda: "framework="
                       "handwritten does not support a tied embedding and head (a parameter "
                       "shared by two modules)")  # fmt: skip
        recompute = np.asarray(train.recompute, dtype=object)
        ok = off | (recompute == "none")
        checks.require(ok, "recompute", lambda: "framework=handwritten is modelled without "
                       "recomputation: recompute must be none (got "
                       f"{checks._first_bad(ok, recompute)[0]!r})")  # fmt: skip


TRAITS: dict[str, Traits] = {
    t.name: t
    for t in (ReferenceTraits(), FSDP2Traits(), MegatronTraits(), DeepSpeedTraits(),
              HandwrittenTraits())
}  # fmt: skip
"""Name -> the framework's traits, one for each choice of ``ParallelSpec.framework``."""
if tuple(TRAITS) != FRAMEWORKS:
    raise RuntimeError("costmodel.specs.frameworks: one Traits entry per framework, in order")


def traits_of(par: Any) -> Traits:
    """The traits of the framework a layout names (``par.framework``, or a name)."""
    name = par if isinstance(par, str) else par.framework
    try:
        return TRAITS[name]
    except (KeyError, TypeError):
        shown = ", ".join(FRAMEWORKS)
        raise SpecError("framework", f"framework must be one of {shown} (got {name!r})") from None


class Pricing(Protocol):
    """What the formulas ask a framework's pricing (``costmodel.frameworks.Framework``,
    whose docstrings say what each returns): they are handed it by the engine
    (``engine.quantities``: ``framework_of(par)``) and never look one up, so the formulas
    import no framework and the frameworks build on the formulas."""

    def state(self, model: Any, train: Any, par: Any, rank: Any) -> dict[str, Any]: ...

    def accumulated_grad_bytes(self, train: Any, par: Any) -> int: ...

    def gathered(self, model: Any, train: Any, par: Any) -> dict | None: ...

    def block_peaks(self, model: Any, train: Any, par: Any, peaks: Any, **kw: Any) -> dict: ...

    def own_peaks(
        self, model: Any, train: Any, par: Any, state: dict, acts: Any, live: Any
    ) -> dict | None: ...

    def fsdp_group(self, model: Any, train: Any) -> dict | None: ...

    def backward_traffic(self, model: Any, train: Any) -> Any: ...


DEFAULTS = {"grad_reduce_fp32": "reduce_fp32_default"}
"""ParallelSpec fields whose unset value (None) is the framework's own, and the trait that
gives it; ``ParallelSpec`` (one spec) and ``sweep`` (columns) fill them with
:func:`framework_defaults`."""


def framework_defaults(framework: Any, given: Any = ()) -> dict[str, Any]:
    """The framework's own values of the :data:`DEFAULTS` fields not in ``given`` (a value
    for a name, a bool array for an array of names)."""
    return {field: trait(framework, name) for field, name in DEFAULTS.items() if field not in given}


def own_stage(framework: Any, fsdp: Any) -> Any:
    """The ZeRO stage a framework runs over ``fsdp`` shard ranks where none is given
    (``Traits.own_stage``), elementwise over arrays of names and degrees."""
    if np.ndim(framework) == 0 and np.ndim(fsdp) == 0:
        return traits_of(str(framework)).own_stage(int(fsdp))
    names, degrees = np.broadcast_arrays(np.asarray(framework), np.asarray(fsdp))
    out = np.empty(names.shape, dtype=int)
    first = names.flat[0] if names.size else None
    groups = [first] if names.size and (names == first).all() else np.unique(names)
    for name in groups:  # the few frameworks, each over its few degrees (a sweep's million
        at = names == name  # rows hold a handful of each)
        values, index = np.unique(degrees[at], return_inverse=True)
        stages = np.array([traits_of(str(name)).own_stage(int(d)) for d in values], dtype=int)
        out[at] = stages[index]
    return out


def fixed_stage(framework: str, fsdp: Any) -> Any:
    """The ZeRO stage a framework that shards its own way runs over ``fsdp`` shard ranks
    (a number, or an int array for an array of degrees); None where the user picks it
    (``zero_stages``). Inputs fill it, ``config.zero_rule`` holds every path to it."""
    return None if traits_of(framework).zero_stages else own_stage(framework, fsdp)


def trait(framework: Any, name: str) -> Any:
    """A trait of the framework(s) named: a value for a name, a bool array for an array."""
    if isinstance(framework, str):
        return getattr(traits_of(framework), name)
    out = None
    for fw, here in _named(np.asarray(framework)):
        out = np.zeros(here.shape, dtype=bool) if out is None else out
        if getattr(fw, name):
            out |= here
    return np.zeros(np.shape(framework), dtype=bool) if out is None else out


def each(framework: Any) -> list[tuple[Traits, Any]]:
    """(framework, where) for each framework named: ``where`` is True for a name, else
    the bool array of the points that name it."""
    if isinstance(framework, str):
        return [(traits_of(framework), True)]
    return [(fw, here) for fw, here in _named(np.asarray(framework)) if here.any()]


_SEEN: dict[int, tuple[np.ndarray, list[tuple[Traits, np.ndarray]]]] = {}


def _named(names: np.ndarray) -> list[tuple[Traits, np.ndarray]]:
    """(framework, where it is named) for every registered framework: one vectorised compare
    each, reused for a read-only array (the planner's candidates, which the rules ask a
    dozen traits of) while it lives. An unknown name raises, naming it."""
    if not names.flags.writeable:
        hit = _SEEN.get(id(names))
        if hit is not None and hit[0] is names:
            return hit[1]
    found, seen = [], np.zeros(names.shape, dtype=bool)
    for key, fw in TRAITS.items():  # a few names: one vectorised compare each
        here = names == key
        found.append((fw, here))
        seen |= here
    if not seen.all():
        traits_of(names[~seen].flat[0])  # raises, naming the unknown framework
    if not names.flags.writeable:
        if len(_SEEN) >= 4:
            _SEEN.clear()
        _SEEN[id(names)] = (names, found)  # the reference keeps the id from being reused
    return found
