"""How one training step is laid out over devices.

Degrees multiply to the device count: ``dp · fsdp · tp · pp · cp``. Placement follows
Megatron-LM's order (tp innermost, then cp, fsdp, dp, pp outermost; Narayanan et al. 2021,
Sec. 3.3): a group whose span fits in one node talks over NVLink/ICI, otherwise over the
inter-node network. Expert parallelism ``ep`` adds no devices: its groups are carved from
the data-parallel ranks (dp · fsdp · cp), next to tp, as torchtitan's and Megatron-LM's.
On TPU meshes, ``mx``/``my`` are the ICI axes given to FSDP and TP (the Scaling Book's
M_X, M_Y): each axis adds a link's bidirectional bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import numpy as np

from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.fields import check_fields, document_fields
from costmodel.specs.frameworks import FRAMEWORKS, framework_defaults, own_stage, trait
from costmodel.specs.frameworks import FrameworkName as Framework
from costmodel.specs.pipeline import dualpipe_rule, first_round_layers, pipeline_rule

ZeroStage = Literal[1, 2, 3]
OverlapRule = Literal["max", "sum"]
ZERO_STAGES: tuple[int, ...] = get_args(ZeroStage)
EPDispatcher = Literal["all-to-all", "deepep", "hybridep"]
EPRouting = Literal["random", "consecutive"]
ExpertGemm = Literal["framework", "loop", "grouped"]
CudaGraphs = Literal["none", "partial", "full"]
PPSchedule = Literal["1f1b", "dualpipe", "dualpipev"]
OVERLAP_RULES: tuple[str, ...] = get_args(OverlapRule)
EP_DISPATCHERS: tuple[str, ...] = get_args(EPDispatcher)
EP_ROUTINGS: tuple[str, ...] = get_args(EPRouting)
EXPERT_GEMMS: tuple[str, ...] = get_args(ExpertGemm)
CUDA_GRAPHS: tuple[str, ...] = get_args(CudaGraphs)
PP_SCHEDULES: tuple[str, ...] = get_args(PPSchedule)
DEGREES = ("dp", "fsdp", "tp", "pp", "cp")


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """Degrees of each kind of parallelism and the overlap rule."""

    dp: int = 1
    """Data-parallel replicas (gradients all-reduced; with fsdp > 1 this is HSDP)."""
    fsdp: int = 1
    """Sharding group X: ZeRO over these devices."""
    zero: ZeroStage | None = None
    """ZeRO stage over the fsdp group: 1 optimizer state, 2 + gradients, 3 + parameters;
    unset, the framework's own over this fsdp: 3, but 1 under Megatron's distributed
    optimizer (3 over fsdp > 1: Megatron-FSDP)."""
    tp: int = 1
    """Tensor (Megatron) parallel degree Y."""
    sequence_parallel: bool = False
    """Shard norms and residual activations over tp too (Korthikanti et al. 2022)."""
    pp: int = 1
    """Pipeline stages."""
    pp_interleave: int = 1
    """Virtual stages per device (interleaved 1F1B; 1 is plain 1F1B; 2 under DualPipeV)."""
    pp_schedule: PPSchedule = "1f1b"
    """The pipeline schedule (``costmodel.parallel.pipeline``): ``1f1b`` (one forward, one
    backward; interleaved where ``pp_interleave`` > 1; Narayanan et al. 2021, Sec. 2.2) or
    ``dualpipe``, DeepSeek-V3's bidirectional schedule (DeepSeek-AI 2024, "DeepSeek-V3
    Technical Report", Sec. 3.2.1 and Table 2; deepseek-ai/DualPipe): micro-batches enter
    from both ends, so each rank holds two stages (r and pp - 1 - r: twice the
    parameters), keeps pp + 1 micro-batches in flight, and runs one micro-batch's forward
    beside another's backward, which hides their expert-parallel all-to-alls; its bubble is
    (pp/2 - 1)(F&B + B - 3W). It needs an even pp, no interleaving, and an even number of
    micro-batches, at least 2 pp (DualPipe's ``step``). ``dualpipev``: DualPipe cut in half
    (torch.distributed.pipelining's ``ScheduleDualPipeV``, torchtitan's ``DualPipeV``): 2 pp
    stages in a V, rank r holding stages r and 2pp - 1 - r (``pp_interleave`` 2; the
    parameters once), 2pp + 1 of them in flight, at least 2 pp micro-batches."""
    pp_split_embedding: bool = False
    """The embedding takes one layer's place in the pipeline split: the first virtual
    stage holds one block less (Megatron-Core's ``--account-for-embedding-in-pipeline-split``;
    with it, n_layers plus the embedding and loss slots must divide over pp * pp_interleave)."""
    pp_split_loss: bool = False
    """The output layer and loss take one layer's place: the last virtual stage holds one
    block less (``--account-for-loss-in-pipeline-split``; e.g. Qwen3-235B's 94 blocks over
    pp 8 x 4 virtual stages, 96 slots of 3)."""
    cp: int = 1
    """Context parallel degree (ring attention over the sequence)."""
    ep: int = 1
    """Expert-parallel degree: each rank of a group of ``ep`` data-parallel ranks holds
    ``n_experts / ep`` of every MoE block's routed experts, and tokens travel to their
    experts and back by all-to-all (GShard, Lepikhin et al. 2020; torchtitan's and
    Megatron-LM's expert parallelism). The groups are carved from the data-parallel ranks,
    from the ZeRO shard group first (torchtitan's dp_shard x cp), so the routed experts are
    sharded over the shard group's ranks outside the ep group and replicated over the rest."""
    etp: int | None = None
    """Expert tensor-parallel degree: each routed expert's matrices split over ``etp``
    ranks (Megatron-Core's ``--expert-tensor-parallel-size``); unset, ``tp``, Megatron's
    default. The expert layers have their own mesh (Megatron's MoE parallel folding, Liu et
    al. 2025): etp x ep x expert-data-parallel spans the tp x cp x dp x fsdp ranks of a
    pipeline stage, so ep may take tensor-parallel ranks (etp 1, ep over tp x dp)."""
    ep_imbalance: float = 1.0
    """Routed tokens the busiest expert-parallel rank receives over the mean (1: balanced
    routing). A stated parameter, not a prediction: it scales that rank's expert matmuls,
    their saved activations and its all-to-all traffic, which the step waits for."""
    capacity_factor: float = 0.0
    """Routed token-expert pairs an expert takes at most, over the mean (Switch
    Transformer, Fedus et al. 2022, Sec. 2.2; Megatron-LM's ``--moe-expert-capacity-factor``):
    pairs routed past it are dropped before dispatch, so the busiest expert-parallel rank
    runs and receives at most ``capacity_factor`` times the mean; 0: dropless (every pair
    runs). At least 1: below it even balanced routing drops pairs, which costmodel does not
    model."""
    capacity_pad: bool = False
    """Every expert's input padded to its capacity (needs ``capacity_factor``): each runs,
    receives and keeps ``capacity_factor`` times the mean whatever the routing, in shapes
    known before the routing, so the dispatch reads nothing back on the host (no sync;
    ``costmodel.parallel.host``): Megatron-Core's ``--moe-pad-expert-input-to-capacity``
    (``drop_and_pad``), which Megatron-Bridge's token-drop recipes set
    (``apply_moe_token_drop``: capacity 1.0 with padding); GShard's and MaxText's dense
    dispatch (``capacity_factor`` > 0 without megablox). False: dropped pairs are removed
    and the rest run as routed (the counts read on the host)."""
    ep_overlap: bool = False
    """Expert-parallel all-to-alls hidden behind another micro-batch's compute: Megatron-Core's
    combined 1F1B (``--overlap-moe-expert-parallel-comm``) runs one micro-batch's forward
    beside another's backward, layer by layer, the dispatch and combine of each on a second
    stream; only the warm-up forwards and cool-down backwards run alone (DeepSeek-V3's
    DualPipe hides them likewise, Sec. 3.2.1). Megatron runs it with pp = 1 or interleaved
    pipelining, one warm-up forward more, and no full recomputation."""
    ep_dispatcher: EPDispatcher = "all-to-all"
    """How tokens reach their experts (``costmodel.kinds.dispatch``): ``all-to-all``
    sends one copy per routed pair (NCCL; Megatron-Core's ``alltoall`` dispatcher,
    torchtitan's default); ``deepep`` one per destination node and rank (DeepEP: Megatron's
    ``flex`` dispatcher, NeMo AutoModel, torchtitan's DeepEP path) at DeepEP's measured
    rates; ``hybridep`` likewise (NVIDIA's HybridEP, Megatron's ``flex`` dispatcher's
    other backend) at the profile's link and network efficiencies."""
    ep_routing: EPRouting = "random"
    """How the router spreads each token's k experts over the expert-parallel ranks, which
    sets the copies a dispatcher sending one per destination (``deepep``, ``hybridep``)
    makes (``costmodel.kinds.routing``): ``random``, each expert independent and uniform
    (a learned router under load balancing; Megatron-Core's force-balanced benchmarks);
    ``consecutive``, k adjacent experts per token (NeMo AutoModel's ``FakeBalancedGate``,
    which its benchmarks run), on one or two ranks. An all-to-all's copies do not depend on
    it."""
    expert_gemm: ExpertGemm = "framework"
    """How the routed experts' GEMMs launch (``costmodel.parallel.host``): ``loop``: one
    GEMM per local expert and linear, from the host, sized by token counts read back from
    the device (Transformer Engine's ``GroupedLinear`` over multi-stream cuBLAS, TE 1.9 to
    2.12; Megatron-Core's legacy ``grouped_gemm`` on Hopper); ``grouped``: one grouped
    kernel per linear reading its offsets on the device (torch's ``_grouped_mm``;
    TE's cuBLASLt grouped GEMM, from TE 2.13 on Blackwell and 2.16 on Hopper; its fused
    grouped MLP); ``framework``: the framework's own (Megatron: loop; the others: grouped)."""
    cuda_graphs: CudaGraphs = "none"
    """Kernels replayed from CUDA graphs, which cost the host one launch per graph instead of
    one per kernel (``costmodel.parallel.host``): ``partial``: each block's attention and
    its MoE router and token preprocessing (Megatron-Core's Transformer Engine graphs,
    ``--cuda-graph-scope attn moe_router moe_preprocess``); ``full``: the whole forward and
    backward (``full_iteration``; an MoE model's dispatch must then be sync-free: static
    shapes from a capacity); ``none``."""
    mx: int = 1
    """Mesh axes (ICI) used by the fsdp/dp group (Scaling Book M_X)."""
    my: int = 1
    """Mesh axes used by the tp group (M_Y)."""
    slices: int = 1
    """TPU slices the devices form (MaxText's ``num_slices``): ICI joins the devices / slices
    chips of one slice, and a group whose span exceeds a slice crosses the data-center
    network (DCN) at the profile's ``network_bw`` per chip (MaxText puts its ``dcn_*``
    parallelism on the outer axes: data parallelism, as placement here does). 1 on GPUs,
    whose nodes are ``devices_per_node``."""
    overlap: OverlapRule = "max"
    """``max``: communication the framework overlaps runs beside compute (current Scaling
    Book); ``sum``: nothing overlapped (its earlier edition). Tensor-parallel collectives
    sit between dependent matmuls and are exposed either way unless ``async_tp``."""
    framework: Framework = "reference"
    """What holds the memory: ``reference`` (this project's model under torch.autocast: fp32
    parameters, kept bf16 weight casts, fp32 residual stream); ``fsdp2`` (FSDP2 with a bf16
    MixedPrecisionPolicy: fp32 sharded parameters, gradients and optimizer state, bf16
    compute and residual, unsharded bf16 weights only for the layers in flight, sharded over
    fsdp x cp as torchtitan does); ``megatron`` (bf16 parameters, main gradients in the
    dtype they are reduced in, distributed optimizer: fp32 master and Adam state sharded
    over the data-parallel group);
    ``deepspeed`` (ZeRO 1/2/3 over fsdp: bf16 parameters and gradients, fp32 master and
    Adam state); ``handwritten`` (``validate/fsdp.py``, the ZeRO-3 people write by hand:
    fp32 shards of every matrix padded to ceil(numel / fsdp), one-dimensional parameters
    replicated, one module's matrices gathered at a time with no prefetch, gradients
    reduce-scattered in fp32; fsdp only, no recomputation, untied embeddings)."""
    grad_reduce_fp32: bool | None = None
    """Gradients reduced in fp32 rather than the compute dtype; unset, the framework's
    own default: fp32 under FSDP2 (torchtitan's ``mixed_precision_reduce = "float32"``)
    and the reference (torch.autocast keeps fp32 parameters, whose gradients DDP reduces
    as they are), the compute dtype under Megatron (as NeMo's performance recipes; its own
    default is fp32) and DeepSpeed (its default communication_data_type)."""
    async_tp: bool = False
    """Tensor-parallel collectives overlapped with the matmuls they feed (async TP:
    torchtitan's micro-pipelined all-gather/reduce-scatter matmuls; Megatron's
    --tp-comm-overlap)."""
    reshard_after_forward: bool = True
    """FSDP2 frees each layer's gathered weights after its forward and gathers them again
    for backward (``fully_shard(reshard_after_forward=True)``, the default); ``False``
    keeps every gathered layer from its forward to its backward (one all-gather per layer
    per step, the whole stage's weights unsharded at the end of forward)."""
    bucket_mb: float = 25.0
    """Gradient bucket size for DDP all-reduces (torch DDP default 25 MiB)."""

    def __post_init__(self) -> None:
        if self.grad_reduce_fp32 is None:
            object.__setattr__(self, "grad_reduce_fp32", self._default("grad_reduce_fp32"))
        if self.zero is None:
            object.__setattr__(self, "zero", self._own_stage())
        object.__setattr__(self, "etp", expert_tp(self.tp, self.etp))
        integers = ("dp", "fsdp", "tp", "pp", "pp_interleave", "cp", "ep", "etp", "mx", "my",
                    "slices")  # fmt: skip
        flags = ("sequence_parallel", "async_tp", "grad_reduce_fp32", "reshard_after_forward",
                 "ep_overlap", "pp_split_embedding", "pp_split_loss", "capacity_pad")  # fmt: skip
        check_fields(self, integers, flags)
        checks.number("bucket_mb", self.bucket_mb)
        if np.any(np.asarray(self.bucket_mb) < 2**-10):
            raise SpecError("bucket_mb", "bucket_mb is a gradient bucket's size in MiB: at "
                            f"least 1 KiB (0.0009765625; got {self.bucket_mb})")  # fmt: skip
        checks.choice("ep_dispatcher", self.ep_dispatcher, EP_DISPATCHERS)
        checks.choice("ep_routing", self.ep_routing, EP_ROUTINGS)
        checks.choice("expert_gemm", self.expert_gemm, EXPERT_GEMMS)
        checks.choice("cuda_graphs", self.cuda_graphs, CUDA_GRAPHS)
        checks.choice("pp_schedule", self.pp_schedule, PP_SCHEDULES)
        checks.number("ep_imbalance", self.ep_imbalance)
        if self.ep_imbalance < 1:
            raise SpecError("ep_imbalance", "ep_imbalance is the busiest rank's tokens over "
                            f"the mean: it must be >= 1 (got {self.ep_imbalance})")  # fmt: skip
        checks.number("capacity_factor", self.capacity_factor, allow_zero=True)
        if 0 < self.capacity_factor < 1:
            raise SpecError("capacity_factor", "capacity_factor must be 0 (dropless) or >= 1 "
                            f"(got {self.capacity_factor}): below 1 even balanced routing "
                            "drops pairs, which costmodel does not model")  # fmt: skip
        if self.capacity_pad and not self.capacity_factor:
            raise SpecError("capacity_pad", "capacity_pad pads each expert to its capacity: "
                            "it needs a capacity_factor >= 1 (got 0, dropless)")  # fmt: skip

    @property
    def devices(self) -> int:
        return device_count(self)

    def batch_step(self, grad_accum: int) -> int:
        """The global batch must be a multiple of this (see :func:`batch_step`)."""
        return batch_step(self.dp, self.fsdp, grad_accum)

    def seq_step(self) -> int:
        """The sequence length must be a multiple of this: cp chunks, each split over tp
        under sequence parallelism."""
        return self.cp * (self.tp if self.sequence_parallel else 1)

    def _default(self, field: str) -> Any:
        """The framework's own value of ``field`` (``specs.frameworks.DEFAULTS``)."""
        checks.choice("framework", self.framework, FRAMEWORKS)
        return bool(framework_defaults(self.framework)[field])

    def _own_stage(self) -> int:
        """The framework's own ZeRO stage over this fsdp (``specs.frameworks``)."""
        checks.choice("framework", self.framework, FRAMEWORKS)
        checks.integer("fsdp", self.fsdp)
        return int(own_stage(self.framework, self.fsdp))

    def replace(self, **changes: Any) -> ParallelSpec:
        """A copy with ``changes``; a field left at its framework's default follows a
        changed framework to the new one's."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = sorted(set(changes) - set(values))
        if unknown:
            raise SpecError(unknown[0], f"unknown ParallelSpec field(s): {', '.join(unknown)}")
        follows = "framework" in changes and "grad_reduce_fp32" not in changes
        if follows and values["grad_reduce_fp32"] == self._default("grad_reduce_fp32"):
            values["grad_reduce_fp32"] = None
        moved = "framework" in changes or "fsdp" in changes
        if moved and "zero" not in changes and values["zero"] == self._own_stage():
            values["zero"] = None  # the own stage follows the framework and fsdp
        if "tp" in changes and "etp" not in changes and np.all(values["etp"] == self.tp):
            values["etp"] = None  # etp left at tp follows it
        return ParallelSpec(**{**values, **changes})


def device_count(par: Any) -> Any:
    """dp·fsdp·tp·pp·cp of a spec, or elementwise of a namespace of degree arrays (a
    sweep's group, the planner's candidates)."""
    return par.dp * par.fsdp * par.tp * par.pp * par.cp


def expert_tp(tp: Any, etp: Any) -> Any:
    """The expert tensor-parallel degree: ``etp`` where given, else ``tp`` (Megatron-Core's
    default ``expert_tensor_parallel_size``: the experts split as the dense layers). The
    one place every entry point (the spec, sweep's columns, the planner's candidates)
    takes it from."""
    return tp if etp is None else etp


def batch_step(dp: Any, fsdp: Any, grad_accum: Any) -> Any:
    """dp·fsdp·grad_accum: each of the dp·fsdp replicas runs ``grad_accum`` micro-batches of
    at least one sequence, so the global batch must be a multiple of this."""
    return dp * fsdp * grad_accum


def grad_accum_of(batch: Any, dp: Any, fsdp: Any, micro_batch: Any, *, field: str) -> Any:
    """Micro-batches per step: ``batch = dp · fsdp · micro_batch · grad_accum``, so
    ``micro_batch · dp · fsdp`` must divide the batch (scalars or arrays; ``field`` names
    the micro-batch input: ``microbatch`` in the CLI and app, ``micro_batch`` in a sweep)."""
    per_step = np.asarray(dp) * np.asarray(fsdp) * np.asarray(micro_batch)
    checks.divides(f"{field} * dp * fsdp", per_step, "batch", batch, field=field)
    accum = np.asarray(batch) // np.maximum(per_step, 1)
    return int(accum) if np.ndim(accum) == 0 else accum


def cp_rule(cp: Any, attention: str) -> None:
    """Ring attention passes K/V blocks of a fused kernel: context parallelism needs flash."""
    ok = np.asarray(cp) == 1 if attention != "flash" else np.ones(np.shape(cp), dtype=bool)
    checks.require(ok, "cp", lambda: "cp > 1 needs attention=flash (ring attention)")


def layout_rules(
    par: Any, model: Any, *, seq: Any, batch: Any, grad_accum: Any, shards_over_cp: Any = False
) -> None:
    """Divisibility of the model and the batch by the degrees (scalars or arrays);
    ``shards_over_cp``: whether the framework's ZeRO group spans the cp ranks."""
    pipeline_rule(par, model)
    dualpipe_rule(par, grad_accum)
    if not model.ffn_only:
        checks.divides("tp", par.tp, "n_heads", model.n_heads)
    checks.divides("tp", par.tp, "d_ff", model.d_ff)
    checks.divides("cp", par.cp, "seq", seq)
    step = batch_step(par.dp, par.fsdp, grad_accum)
    checks.divides("dp * fsdp * grad_accum", step, "batch", batch, field="dp")
    sp = np.asarray(par.sequence_parallel, dtype=bool)
    if np.any(sp):  # sequence parallelism splits each cp chunk over the tp ranks
        tp_sp = np.where(sp, par.tp, 1)
        checks.divides("tp", tp_sp, "seq / cp", seq // np.asarray(par.cp))
    kv, tp = np.asarray(model.n_kv_heads), np.asarray(par.tp)
    if not model.ffn_only:
        ok = (kv % tp == 0) | (tp % kv == 0)
        checks.require(ok, "tp", lambda: "tp must divide n_kv_heads or be a multiple of it "
                       f"(got {checks.pair(ok, tp, kv, 'tp', 'n_kv_heads')})")  # fmt: skip
    ok = (np.asarray(par.pp_interleave) == 1) | (np.asarray(par.pp) > 1)
    checks.require(ok, "pp_interleave", lambda: "pp_interleave > 1 needs pp > 1")
    for flag in ("sequence_parallel", "async_tp"):  # each splits work over the tp ranks
        ok = ~np.asarray(getattr(par, flag, False), dtype=bool) | (tp > 1)
        checks.require(ok, flag, lambda f=flag: f"{f} works over the tensor-parallel ranks: it "
                       "needs tp > 1")  # fmt: skip
    kept = ~np.asarray(getattr(par, "reshard_after_forward", True), dtype=bool)
    ok = ~kept | np.asarray(trait(par.framework, "reshard_option"), dtype=bool)
    checks.require(ok, "reshard_after_forward", lambda: "reshard_after_forward=False keeps "
                   "FSDP2's gathered layers to the backward (fully_shard's option): framework "
                   "fsdp2 (the others run their own schedules)")  # fmt: skip
    checks.divides("slices", getattr(par, "slices", 1), "the device count", device_count(par))
    moe_rule(par, model, shards_over_cp)


def moe_rule(par: Any, model: Any, shards_over_cp: Any = False) -> None:
    """The layouts an MoE model is costed under: data, FSDP, tensor (with sequence
    parallelism, as Megatron-Core requires), context, pipeline and expert parallelism, the
    experts on a mesh of their own (``ParallelSpec.etp``; which frameworks run tp with
    experts is their trait, ``config.framework_rules``). ``ep`` divides the routed
    experts, ``etp`` their width, and ``ep * etp`` the tp x dp x fsdp x cp ranks of a
    stage (Megatron-Core's ``initialize_model_parallel``: expert tensor x expert x
    expert-data parallel sizes multiply to that); the data-parallel ranks an expert group
    takes nest with the ZeRO shard group, dividing it or being a multiple of it
    (``costmodel.parallel.experts.expert_shards``); the dense leading blocks lie within
    the first round of pipeline stages."""
    experts = np.asarray(getattr(model, "n_experts", 0))
    moe, ep = experts > 0, np.asarray(getattr(par, "ep", 1))
    capacity = np.asarray(getattr(par, "capacity_factor", 0.0))
    checks.require(moe | (capacity == 0), "capacity_factor", lambda: "capacity_factor needs a "
                   "mixture-of-experts model (n_experts >= 1)")  # fmt: skip
    checks.require(moe | (ep == 1), "ep", lambda: "ep > 1 needs a mixture-of-experts model "
                   "(n_experts >= 1)")  # fmt: skip
    imbalance = np.asarray(getattr(par, "ep_imbalance", 1.0))
    checks.require(moe | (imbalance == 1), "ep_imbalance", lambda: "ep_imbalance needs a "
                   "mixture-of-experts model (n_experts >= 1)")  # fmt: skip
    ok = (ep == 1) | (imbalance <= ep)
    checks.require(ok, "ep_imbalance", lambda: "ep_imbalance is the busiest rank's share over "
                   "the mean: at most ep, every pair on one rank (got "
                   f"{checks.pair(ok, imbalance, ep, 'ep_imbalance', 'ep')})")  # fmt: skip
    plain = np.asarray(getattr(par, "ep_dispatcher", "all-to-all")) == "all-to-all"
    checks.require(plain | (ep > 1), "ep_dispatcher", lambda: "ep_dispatcher picks how tokens "
                   "travel between expert-parallel ranks: it needs ep > 1")  # fmt: skip
    spread = np.asarray(getattr(par, "ep_routing", "random")) == "random"
    checks.require(spread | (ep > 1), "ep_routing", lambda: "ep_routing says how a token's "
                   "experts spread over expert-parallel ranks: it needs ep > 1")  # fmt: skip
    checks.divides("ep", np.where(moe, ep, 1), "n_experts", np.where(moe, experts, 1))
    expert_mesh_rule(par, model, moe, shards_over_cp)
    first = first_round_layers(par, model)
    dense = np.asarray(getattr(model, "dense_layers", 0))
    ok = ~moe | (np.asarray(par.pp) == 1) | (dense <= first)
    got = lambda: checks.pair(ok, dense, first, "dense_layers", "first round")  # noqa: E731
    checks.require(ok, "pp", lambda: "the dense leading blocks must lie within the first "
                   "pp virtual stages (one per pipeline rank; with interleaving, the first "
                   f"round): dense_layers <= the blocks those hold (got {got()})")  # fmt: skip


def expert_mesh_rule(par: Any, model: Any, moe: Any, shards_over_cp: Any) -> None:
    """The expert layers' mesh (:func:`moe_rule`): etp, ep x etp over a stage's ranks and
    the ZeRO nesting of an expert group's data-parallel ranks."""
    tp, ep, etp = (np.asarray(getattr(par, k)) for k in ("tp", "ep", "etp"))
    checks.require(moe | (etp == tp), "etp", lambda: "etp (expert tensor parallelism) "
                   "needs a mixture-of-experts model (n_experts >= 1)")  # fmt: skip
    width = getattr(model, "d_ff_expert", None) or model.d_ff
    checks.divides("etp", np.where(moe, etp, 1), "d_ff_expert", width)
    data = np.asarray(par.dp) * np.asarray(par.fsdp) * np.asarray(par.cp)
    checks.divides("ep * etp", ep * etp, "tp * dp * fsdp * cp", tp * data, field="ep")
    taken = ep * etp // np.maximum(tp, 1)  # data-parallel ranks an expert group spans
    shard = np.asarray(par.fsdp) * np.where(shards_over_cp, np.asarray(par.cp), 1)
    whole = (ep * etp) % tp == 0
    ok = ~whole | (shard % np.maximum(taken, 1) == 0) | (taken % shard == 0)
    got = lambda: checks.pair(ok, taken, shard, "ep * etp / tp", "shard group")  # noqa: E731
    checks.require(ok, "ep", lambda: "ep must divide the ZeRO shard group or be a multiple "
                   f"of it (got {got()})")  # fmt: skip


def fill_dp(parallel: ParallelSpec, gpus: int, *, shard: bool = False) -> ParallelSpec:
    """The data-parallel devices fill what the other degrees leave: as replicas (dp), or
    with ``shard`` as one ZeRO/FSDP shard group (fsdp; torchtitan's ``dp_shard = -1``,
    DeepSpeed's ZeRO over the whole data-parallel group)."""
    axis = "fsdp" if shard else "dp"
    other = parallel.devices // getattr(parallel, axis)
    if gpus % other:
        names = [n for n in ("dp", "fsdp", "tp", "pp", "cp") if n != axis]
        split = [n for n in names if getattr(parallel, n) > 1]
        field = split[0] if len(split) == 1 else "gpus"  # the one degree to mend (a probe)
        raise SpecError(field, f"{' * '.join(names)} must divide gpus (got {other} and "
                        f"gpus={gpus})")  # fmt: skip
    return parallel.replace(**{axis: gpus // other})


document_fields(ParallelSpec)
