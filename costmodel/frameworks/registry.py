"""The framework protocol and its registry: what a framework is, and how a name finds one.

A framework says what each device holds, which collectives run when and what they
overlap, and which layouts it refuses. Each one is a module of this package defining a
:class:`Framework` subclass and exporting one instance as ``FRAMEWORK``; the formulas
(``costmodel.parallel``) and the rules (``costmodel.config``) ask the registered object,
never a framework's name. This module imports no formula, so every layer may import it.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from costmodel.specs.checks import SpecError
from costmodel.specs.parallel import FRAMEWORKS

if TYPE_CHECKING:
    import sympy as sp

    from costmodel.parallel.pipeline import PipelineRank
    from costmodel.specs.model import ModelSpec, TrainSpec
    from costmodel.specs.parallel import ParallelSpec


class Framework:
    """One training framework's behaviour. Traits are class attributes (plain data, also
    read on arrays of names by :func:`trait`); behaviour that differs beyond a trait is a
    method, whose default here is what most frameworks do."""

    name: ClassVar[str]
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
    shards_by_default: ClassVar[bool] = False
    """With no sharding degree stated, the data-parallel devices form one shard group
    (torchtitan's ``dp_shard = -1``; DeepSpeed's ZeRO over its data-parallel group); else
    they are replicas (DDP; Megatron's distributed optimizer shards over them anyway)."""
    reduce_fp32_default: ClassVar[bool] = False
    """Gradients are reduced in fp32 unless told otherwise (torchtitan's
    ``mixed_precision_reduce = "float32"``); the planner's candidates follow it."""

    def rules(self, par: Any, model: Any, train: Any, on: Any) -> None:
        """Layouts this framework refuses beyond the shared rules, at the points ``on``
        (a bool or bool array; the fields may be arrays); nothing by default."""

    def own_stage(self, fsdp: int) -> int:
        """The ZeRO stage the framework runs over ``fsdp`` shard ranks where the user picks
        none (``zero_stage``)."""
        return self.zero_stage

    def shardings(self, replicas: int) -> list[tuple[int, int, int]]:
        """(dp, fsdp, zero) of ``replicas`` data-parallel devices the planner tries: ZeRO
        1/2/3 over every replica."""
        return [(1, replicas, z) for z in (1, 2, 3)]

    def state(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
    ) -> dict[str, sp.Expr]:
        """Bytes per device of params (working weights), master, grads and optimizer
        state; by default torch.autocast's state under ZeRO over X."""
        from costmodel.parallel.state import autocast_state

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
    each choice of ``ParallelSpec.framework`` (imported on first use, so that the formulas
    the modules build on may import this one)."""
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
    (``Framework.own_stage``), elementwise over arrays of names and degrees."""
    if np.ndim(framework) == 0 and np.ndim(fsdp) == 0:
        return framework_of(str(framework)).own_stage(int(fsdp))
    return np.vectorize(lambda f, x: framework_of(f).own_stage(int(x)), otypes=[int])(
        framework, fsdp
    )


def fixed_stage(framework: str, fsdp: Any) -> Any:
    """The ZeRO stage a framework that shards its own way runs over ``fsdp`` shard ranks
    (a number, or an int array for an array of degrees); None where the user picks it
    (``zero_stages``). Inputs fill it, ``config.zero_rule`` holds every path to it."""
    return None if framework_of(framework).zero_stages else own_stage(framework, fsdp)


def trait(framework: Any, name: str) -> Any:
    """A trait of the framework(s) named: a value for a name, a bool array for an array."""
    if isinstance(framework, str):
        return getattr(framework_of(framework), name)
    out = None
    for fw, here in _named(np.asarray(framework)):
        out = np.zeros(here.shape, dtype=bool) if out is None else out
        if getattr(fw, name):
            out |= here
    return np.zeros(np.shape(framework), dtype=bool) if out is None else out


def each(framework: Any) -> list[tuple[Framework, Any]]:
    """(framework, where) for each framework named: ``where`` is True for a name, else
    the bool array of the points that name it."""
    if isinstance(framework, str):
        return [(framework_of(framework), True)]
    return [(fw, here) for fw, here in _named(np.asarray(framework)) if here.any()]


_SEEN: dict[int, tuple[np.ndarray, list[tuple[Framework, np.ndarray]]]] = {}


def _named(names: np.ndarray) -> list[tuple[Framework, np.ndarray]]:
    """(framework, where it is named) for every registered framework: one vectorised compare
    each, reused for a read-only array (the planner's candidates, which the rules ask a
    dozen traits of) while it lives. An unknown name raises, naming it."""
    if not names.flags.writeable:
        hit = _SEEN.get(id(names))
        if hit is not None and hit[0] is names:
            return hit[1]
    found, seen = [], np.zeros(names.shape, dtype=bool)
    for key, fw in registry().items():  # a few names: one vectorised compare each
        here = names == key
        found.append((fw, here))
        seen |= here
    if not seen.all():
        framework_of(names[~seen].flat[0])  # raises, naming the unknown framework
    if not names.flags.writeable:
        if len(_SEEN) >= 4:
            _SEEN.clear()
        _SEEN[id(names)] = (names, found)  # the reference keeps the id from being reused
    return found
