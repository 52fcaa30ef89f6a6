"""What a serving question states: the requests, their lengths, the dtypes, the layout.

A request brings ``input`` prompt tokens and generates ``output`` tokens; at its end a
sequence's cache holds ``context = input + output`` tokens. ``batch`` requests run at once
(the engine's concurrency). Weights and GEMMs run in ``precision``, the cache in
``kv_dtype``; ``tp`` ranks split each layer (Megatron's split, as vLLM, SGLang and
TensorRT-LLM run it), ``dp`` replicas serve apart (throughput adds up). The cache is paged in
blocks of ``block_size`` tokens (vLLM's default 16), and the ``engine``
(``costmodel.specs.engines``) may use ``memory_utilization`` of each device's memory;
what is not given (the cache dtype, the memory share) is the engine's default.
Every field is checked here once, by name; ``costmodel.specs.serving_device.check`` adds
what depends on the model and the device.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT as DEFAULT_ENGINE
from costmodel.specs.engines import ENGINES, Engine, engine
from costmodel.specs.fields import document_fields, plain_scalars
from costmodel.specs.hardware import KERNEL_FAMILIES

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "nvfp4": 0.5625,
               "mxfp4": 0.53125}  # fmt: skip
"""Bytes per element of the weight and cache dtypes, block scales included: NVFP4 is 4-bit
E2M1 elements with an fp8 (E4M3) scale per 16 (4.5 bits; NVIDIA's NVFP4 format, its
per-tensor fp32 scale negligible), MXFP4 4-bit elements with an 8-bit (E8M0) scale per 32
(4.25 bits; OCP Microscaling Formats (MX) v1.0, Sec. 5)."""
PRECISIONS = ("bf16", "fp16", "fp8", "nvfp4", "mxfp4", "fp32")
"""Weights and GEMMs: 16-bit, fp8 (W8A8, the fp8 checkpoints vLLM and TensorRT-LLM run),
NVFP4 (W4A4 at the device's fp4 peak: Blackwell's NVFP4 checkpoints), MXFP4 (4-bit weights
beside 8-bit activations where the device computes fp4, MXFP8 W4A8 as gpt-oss runs on
Blackwell, else 16-bit: W4A16), or fp32 (CPUs, and the reference model in ``validate.run
--suite serve``)."""
FP8_SCALINGS = ("auto", "tensor", "block")
"""How fp8 weights are scaled (``ServeSpec.fp8_scaling``)."""
KV_DTYPES = ("bf16", "fp16", "fp8", "nvfp4", "int8", "fp32")
ARRIVALS = ("together", "continuous", "poisson")
"""How requests reach the engine: the batch's prompts together, prefilled then decoded (a
static batch); a continuously batched engine kept full, or at a request rate its mean steady
state (``costmodel.serving.continuous``); or requests at a rate arriving at random, served
one by one by a continuously batching engine (``costmodel.serving.queueing``)."""
MAX_RATE = 10**6
"""The largest request rate a question takes (requests/s; 1e308 printed 309 digits)."""
MAX_REQUESTS = 100_000
"""The most requests a workload simulation serves (``requests``)."""
STEADY_REQUESTS = 1000
"""Requests simulated for a steady state (``requests`` None)."""
MAX_ROPE_SCALING = 1024
"""The largest ``rope_scaling`` taken: YaRN (Peng et al. 2023) is used at 4x (Qwen) to 40x
(DeepSeek-V3); a factor far beyond is a typo, not a model."""
MAX_BLOCK_SIZE = 2**16
"""The largest ``block_size`` taken, in tokens: engines page their caches in blocks of 1 to
a few hundred tokens (vLLM's ``--block-size`` 1 to 128, 16 by default; SGLang's
``--page-size`` 1 by default; TensorRT-LLM's ``tokens_per_block`` 32 or 64), so a block of
65,536 is past any, and one of a billion tokens is a typo, not an engine."""


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    """One serving workload on one layout (tokens, requests, bytes)."""

    input: int
    """Prompt tokens per request."""
    output: int
    """Generated tokens per request (the first comes from prefill)."""
    batch: int = 1
    """Requests served at once by each of the ``dp`` replicas (``concurrency`` and
    ``request_rate`` are the whole deployment's)."""
    precision: str = "bf16"
    """``PRECISIONS``: the weights' and GEMMs' dtype (fp8 checkpoints keep the embedding,
    head and norms in bf16)."""
    kv_dtype: str | None = None
    """``KV_DTYPES``: the cache's dtype; None: the engine's rule for ``precision`` (the
    weights' 16-bit dtype, or TensorRT-LLM's fp8 cache beside fp8 weights)."""
    tp: int = 1
    """Tensor-parallel devices of a replica, within one node."""
    dp: int = 1
    """Replicas, each serving its own requests."""
    block_size: int = 16
    """Tokens per cache block (paged attention, Kwon et al. 2023, Sec. 4.1)."""
    memory_utilization: float | None = None
    """Share of a device's memory the engine may take (weights, cache, activations); None:
    the engine's default."""
    engine: str = DEFAULT_ENGINE
    """The serving engine (``costmodel.specs.engines.ENGINES``: vllm, vllm-0.6,
    vllm-0.5, sglang, trtllm, or eager, the reference model op by op): its defaults and its
    host time per iteration."""
    token_budget: int | None = None
    """Tokens an iteration may hold (vLLM's ``max_num_batched_tokens``, SGLang's
    ``chunked_prefill_size``, TensorRT-LLM's ``max_num_tokens``); None: the engine's default
    (for an engine that prefills whole prompts, the model's context length, set by
    ``serve``)."""
    rope_scaling: float = 1.0
    """Factor by which RoPE scaling (YaRN, Peng et al. 2023) stretches the positions."""
    draft_tokens: int = 0
    """Speculative decoding: tokens a drafter proposes per step, one after another, that
    one forward pass of the model then verifies (Leviathan et al. 2023); 0: off."""
    acceptance: float | None = None
    """The chance that the model accepts a drafted token (given the ones before it were):
    the workload's and the drafter's, so it is stated, never assumed (DeepSeek-V3 reports
    0.85-0.9 for its MTP module's one token, Sec. 5.4.3)."""
    draft_layers: int = 1
    """Layers of the model's own shape the drafter runs per proposed token, reading the
    model's embedding and head: an EAGLE head or a multi-token-prediction module (both one
    layer; Li et al. 2024, DeepSeek-AI 2024 Sec. 2.2)."""
    attention_kernel: str = "auto"
    """The fused-attention kernel family a prompt runs (``Hardware.attention_kernels``:
    ``fa2``, ``fa3``, ``cudnn``, ``triton-2022``), as a deployment that sets its backend
    states it (vLLM's ``VLLM_FLASH_ATTN_VERSION``, SGLang's ``--attention-backend``);
    ``auto``: the engine's on the device (``Engine.prefill_attention``)."""
    fp8_scaling: str = "auto"
    """``FP8_SCALINGS``: how fp8 weights are scaled: ``tensor`` (one scale per tensor or
    channel: TensorRT-LLM's and ModelOpt's checkpoints), ``block`` (one per 128 x 128 block
    of weights and per 1 x 128 group of activations: DeepSeek-V3's and Qwen3's own fp8
    checkpoints), whose routed experts run in the kernel the engine runs them in
    (``Engine.block_fp8_moe``); ``auto``: the model's own fp8 checkpoint's
    (``costmodel.catalog.presets.FP8_BLOCK``), ``tensor`` for other models."""

    arrival: str = "together"
    """``ARRIVALS``: a static batch, continuous batching in steady state, or random
    (Poisson) arrivals at ``request_rate``, simulated (``costmodel.serving.queueing``)."""
    request_rate: float | None = None
    """Requests per second arriving at the deployment, over its ``dp`` replicas. Under
    ``continuous`` the engine holds as many sequences as the rate keeps in flight
    (``costmodel.serving.continuous.in_flight``; means, no queueing), ``batch`` at most;
    under ``poisson`` the requests are simulated one by one; None: ``batch`` in flight."""
    concurrency: int | None = None
    """A closed loop of this many users over the ``dp`` replicas, each sending its next
    request when its last one ends (benchmarks' ``--max-concurrency``), simulated
    (``costmodel.serving.queueing``); ``batch`` at most in flight a replica."""
    requests: int | None = None
    """A benchmark of this many requests (``poisson`` or ``concurrency``), measured as
    vLLM's and SGLang's ``bench_serving`` measure one: every request counted, throughput
    over the whole run, first arrival to last completion (the drain after the last arrival
    included). None: the steady state, from ``STEADY_REQUESTS`` simulated requests, the
    first tenth (the engine filling up) and the drain not counted."""
    length_spread: float = 0.0
    """A simulated workload's spread of request lengths: each request's prompt and output
    drawn uniformly within ``input`` and ``output`` x (1 +- spread), whole tokens, seeded
    (0: every request the stated lengths). Benchmarks' random datasets draw so: vLLM's
    ``--random-range-ratio r`` over [L(1 - r), L(1 + r)] (spread r around L), SGLang's
    bench_serving over [L·r, L] (its default r = 0: spread 1 around L/2, the lengths to state).
    The longest outputs set a benchmark's drain; the engine's admission stays sized for
    the mean request."""
    pp: int = 1
    """Pipeline stages a replica's layers split over (each of ``tp`` devices)."""
    ep: int = 1
    """Expert parallelism: a mixture-of-experts model's routed experts split whole over ep
    devices spanning the tp ranks of ep / tp replicas, each replica attending its own
    requests (attention data parallelism); 1: every expert split over tp."""
    redundant_experts: int = 0
    """Extra copies of routed experts spread over the ep devices (DeepSeek-V3's deployment
    keeps 32 in prefill and decode, Sec. 3.4; SGLang's and vLLM's EPLB
    ``--ep-num-redundant-experts``): a device holds (E + R) / ep experts, the load per copy
    balanced; 0: none."""
    prefill_replicas: int = 0
    """Disaggregated serving: replicas of ``prefill_tp`` devices that only prefill, handing
    each prompt's cache to the ``dp`` decode replicas (DistServe, Zhong et al. 2024;
    Splitwise, Patel et al. 2024; NVIDIA Dynamo); 0: every replica prefills and decodes
    its own requests."""
    prefill_tp: int | None = None
    """Tensor-parallel degree of a prefill replica (default ``tp``)."""
    batch_overlap: bool = False
    """Two micro-batches a step, each one's expert dispatch and combine running beside the
    other's attention and experts (SGLang's ``--enable-two-batch-overlap``, LMSYS's
    large-scale EP deployment of 2025-05-05; vLLM's dual-batch overlap, ``--enable-dbo``):
    each micro-batch reads the weights, and the step's all-to-alls hide behind the other's
    kernels (``costmodel.serving.experts.exposed_alltoall_s``). Needs ep > tp (a dispatch to
    hide) and an engine that runs it."""

    def __post_init__(self) -> None:
        plain_scalars(self)
        for name in (
            "input",
            "output",
            "batch",
            "tp",
            "pp",
            "dp",
            "ep",
            "block_size",
            "draft_layers",
        ):
            checks.integer(name, getattr(self, name))
        checks.at_most("block_size", self.block_size, f"{MAX_BLOCK_SIZE:,}", MAX_BLOCK_SIZE,
                       "tokens (engines page caches in blocks of 1 to a few hundred)")  # fmt: skip
        checks.integer("draft_tokens", self.draft_tokens, minimum=0)
        checks.integer("prefill_replicas", self.prefill_replicas, minimum=0)
        checks.integer("redundant_experts", self.redundant_experts, minimum=0)
        if self.redundant_experts and self.ep == 1:
            raise SpecError("redundant_experts", "redundant_experts needs ep > 1 (copies of "
                            "routed experts spread over the expert-parallel devices)")  # fmt: skip
        if self.prefill_tp is not None:
            checks.integer("prefill_tp", self.prefill_tp)
            if not self.prefill_replicas:
                raise SpecError("prefill_tp", "prefill_tp needs prefill_replicas > 0 "
                                "(disaggregated prefill)")  # fmt: skip
        self._check_speculative()
        checks.choice("precision", self.precision, PRECISIONS)
        checks.choice("engine", self.engine, ENGINES)
        checks.choice("attention_kernel", self.attention_kernel, ("auto", *KERNEL_FAMILIES))
        checks.choice("fp8_scaling", self.fp8_scaling, FP8_SCALINGS)
        if self.fp8_scaling != "auto" and self.precision != "fp8":
            raise SpecError("fp8_scaling", f"fp8_scaling {self.fp8_scaling} needs precision fp8 "
                            f"(got {self.precision})")  # fmt: skip
        kind = engine(self.engine)
        if self.kv_dtype is None:
            object.__setattr__(self, "kv_dtype", kind.cache_dtype(self.precision))
        if self.memory_utilization is None:
            object.__setattr__(self, "memory_utilization", kind.memory_share(self.tp))
        checks.choice("kv_dtype", self.kv_dtype, KV_DTYPES)
        if self.token_budget is None and not kind.whole_prompts:
            object.__setattr__(self, "token_budget", kind.token_budget)
        if self.token_budget is not None:
            checks.integer("token_budget", self.token_budget)
        checks.choice("arrival", self.arrival, ARRIVALS)
        self._check_workload()
        self._check_spread()
        self._check_overlap(kind)
        checks.number("memory_utilization", self.memory_utilization)
        checks.at_most("memory_utilization", self.memory_utilization, "1", 1)
        check_rope_scaling(self.rope_scaling)

    def _check_workload(self) -> None:
        if self.requests is not None:
            checks.integer("requests", self.requests)
            checks.at_most("requests", self.requests, f"{MAX_REQUESTS:,}", MAX_REQUESTS)
        if self.request_rate is not None:
            checks.number("request_rate", self.request_rate)
            checks.at_most("request_rate", self.request_rate, f"{MAX_RATE:,}", MAX_RATE,
                           "requests/s (a million a second: no deployment this prices "
                           "serves more)")  # fmt: skip
            if self.arrival == "together":
                raise SpecError("request_rate", "request_rate needs arrival=continuous or "
                                "poisson (an engine admitting requests as they come)")  # fmt: skip
        elif self.arrival == "poisson":
            raise SpecError("arrival", "arrival=poisson needs request_rate (requests/s)")
        if self.concurrency is not None:
            checks.integer("concurrency", self.concurrency)
            checks.at_most("concurrency", self.concurrency, f"{MAX_REQUESTS:,}", MAX_REQUESTS)
            if self.request_rate is not None:
                raise SpecError("concurrency", "concurrency (a closed loop of users) and "
                                "request_rate (an open loop): give one")  # fmt: skip
            if self.arrival != "continuous":
                raise SpecError("concurrency", "concurrency (a closed loop of users) runs "
                                "continuous batching: leave arrival out")  # fmt: skip
            if self.requests is not None and self.requests < self.concurrency:
                raise SpecError("requests", f"requests must be >= concurrency (got requests="
                                f"{self.requests:,}, concurrency={self.concurrency:,}): each "
                                "of the users sends at least one")  # fmt: skip

    def _check_spread(self) -> None:
        checks.number("length_spread", self.length_spread, allow_zero=True)
        checks.at_most("length_spread", self.length_spread, "1", 1, "(lengths from 0 to "
                       "twice the stated ones)")  # fmt: skip
        if self.length_spread and not self.simulated:
            raise SpecError("length_spread", "length_spread draws each request's lengths in a "
                            "simulated workload: give request_rate or concurrency (a batch is "
                            "priced at its stated lengths)")  # fmt: skip

    def _check_overlap(self, kind: Engine) -> None:
        checks.flag("batch_overlap", self.batch_overlap)
        if not self.batch_overlap:
            return
        if self.ep <= self.tp:
            raise SpecError(
                "batch_overlap",
                "batch_overlap hides the expert dispatch and "
                f"combine: it needs ep > tp (got ep={self.ep}, tp={self.tp})",
            )
        if not kind.batch_overlap_flag:
            runs = ", ".join(f"{name} ({e.batch_overlap_flag})" for name, e in ENGINES.items()
                             if e.batch_overlap_flag)  # fmt: skip
            raise SpecError("batch_overlap", f"engine {self.engine} runs no two-batch overlap; "
                            f"{runs} do")  # fmt: skip

    @property
    def engine_kind(self) -> Engine:
        """The serving engine this workload runs on (``costmodel.specs.engines``)."""
        return engine(self.engine)

    @property
    def simulated(self) -> bool:
        """Whether the workload is served request by request (``costmodel.serving.queueing``)."""
        return self.arrival == "poisson" or self.concurrency is not None

    def _check_speculative(self) -> None:
        if self.draft_tokens and self.acceptance is None:
            raise SpecError("acceptance", "draft_tokens > 0 needs acceptance: the chance a "
                            "drafted token is accepted, in (0, 1] (e.g. 0.85 for DeepSeek-V3's "
                            "MTP module)")  # fmt: skip
        if self.acceptance is None:
            return
        if not self.draft_tokens:
            raise SpecError("acceptance", "acceptance needs draft_tokens > 0 (speculative "
                            "decoding)")  # fmt: skip
        checks.number("acceptance", self.acceptance)
        if self.acceptance > 1:
            raise SpecError("acceptance", f"acceptance is a probability: it must be in (0, 1] "
                            f"(got {self.acceptance:g})")  # fmt: skip

    @property
    def context(self) -> int:
        """Tokens a sequence's cache holds at its end."""
        return self.input + self.output

    @property
    def gpus(self) -> int:
        """Devices of the deployment: the (decode) replicas and any prefill replicas."""
        return self.tp * self.pp * self.dp + self.prefill_replicas * self.prefill_degree

    @property
    def prefill_degree(self) -> int:
        return self.tp if self.prefill_tp is None else self.prefill_tp


document_fields(ServeSpec)


def check_rope_scaling(value: float) -> None:
    """A RoPE scaling factor: a finite number in [1, ``MAX_ROPE_SCALING``]."""
    checks.number("rope_scaling", value)
    if value < 1:
        raise SpecError("rope_scaling", f"rope_scaling must be >= 1 (got {value})")
    checks.at_most("rope_scaling", value, "1024", MAX_ROPE_SCALING,
                   "(YaRN factors in use stretch positions 4x to 40x)")  # fmt: skip
