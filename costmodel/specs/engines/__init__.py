"""Serving engines as kinds: what each engine runs by default and what its host costs a step.

An engine is one module here that registers an :class:`Engine` (``register``); ``serve``
prices a workload on the engine its ``ServeSpec.engine`` names (:func:`engine`). What an
engine states:

- **Defaults** a user does not restate: the most sequences in flight (vLLM's and SGLang's
  ``max_num_seqs`` / ``max_running_requests``, TensorRT-LLM's ``max_batch_size``), the
  tokens an iteration may hold (``max_num_batched_tokens``, ``chunked_prefill_size``,
  ``max_num_tokens``), the share of device memory it takes, and its cache dtype's rule (the
  model's 16-bit dtype, or an fp8 checkpoint's fp8 cache).
- **Prefill attention kernel**: the fused-attention family its prefill runs where the
  device's profile measures it (``prefill_attention``; FlashAttention-3 and kernels of its
  design run only on Hopper, whose profiles alone list ``fa3``), else the device's default.
- **Host time per iteration** (seconds): the scheduler, input preparation, sampling's
  launch and the output processing (detokenisation, the responses) an engine's Python or
  C++ runtime spends, a fixed part plus a part per running sequence, with CUDA graphs
  replaying the model's kernels. What the device waits for (``step_s``, ``seq_s``) adds to
  its time; what the engine does while the device runs the next iteration
  (``async_step_s``, ``async_seq_s``: vLLM 0.6's asynchronous output processing, vLLM's
  asynchronous scheduling, SGLang's and TensorRT-LLM's overlap schedulers) costs only where
  it is the longer: an iteration is serial + max(device, overlapped) (the GPU bubbles of
  vLLM issue #6854; Srivatsa et al. 2024, "Can Scheduling Overhead Dominate LLM Inference
  Performance?"). Each module cites its figures.

Each engine's ``sources`` quote the documentation or code line each default comes from;
``tests/test_serving_engines.py`` holds every default to its quote.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from costmodel.specs.checks import SpecError

DEFAULT = "vllm"
"""The engine a serving question takes unless it names one: vLLM's current (V1) engine."""


@dataclass(frozen=True)
class Engine:
    """One serving engine (one generation of it): its defaults and its host time per step."""

    name: str
    """What ``--engine`` takes."""
    title: str
    """How answers name it (engine and version)."""
    max_seqs: int
    """Sequences in flight at most (the engine's default cap)."""
    token_budget: int
    """Tokens (prompt chunks and decodes) an iteration may hold by default (at least, where
    the engine prefills ``whole_prompts``)."""
    memory_utilization: float
    """Share of a device's memory the engine takes by default."""
    fp8_cache_with_fp8_weights: bool
    """Whether an fp8 (or NVFP4) checkpoint is served with an fp8 cache unless the user says
    otherwise (TensorRT-LLM); else the cache is 16-bit (vLLM's and SGLang's ``auto``: the
    model's dtype)."""
    step_s: float
    """Host seconds per iteration the device waits for (scheduling, preparing the inputs,
    sampling's launch, whatever its size)."""
    seq_s: float
    """Host seconds per running sequence per iteration the device waits for."""
    async_step_s: float = 0.0
    """Host seconds per iteration done while the device runs the next one (asynchronous
    output processing, an overlap scheduler's preparation of the next batch)."""
    async_seq_s: float = 0.0
    """Host seconds per running sequence per iteration done beside the device."""
    whole_prompts: bool = False
    """Whether the engine prefills whole prompts (vLLM V0 without chunked prefill): its
    budget is then the model's context length, at least ``token_budget``."""
    memory_by_tp: tuple[tuple[int, float], ...] = ()
    """(least tp, share) pairs, largest tp first, where the default share depends on tp
    (SGLang's ``mem_fraction_static``); empty: ``memory_utilization`` at every tp."""
    fused: bool = True
    """Whether a layer's elementwise work is fused into few kernels (every engine); the
    reference model runs it op by op (priced by ``serving.estimate``)."""
    dispatch_s: float = 0.0
    """Host seconds per kernel an engine that runs op by op dispatches on an accelerator
    whose profile states none (``Hardware.dispatch_s`` 0: the catalog's); a measured
    profile's own wins (``costmodel.serving.eager.host_s``)."""
    batch_overlap_flag: str = ""
    """The engine's flag for two micro-batches per step, each one's expert dispatch and
    combine beside the other's compute (``ServeSpec.batch_overlap``); empty: it has none."""
    prefill_attention: tuple[str, ...] = ()
    """Fused-attention kernel families (``Hardware.attention_kernels`` names) the engine's
    prefill runs, first choice first: the first the device's profile lists is priced
    (:meth:`attention_kernel`); none listed, or empty: the device's default (``auto``)."""
    block_fp8_moe: str = ""
    """The kernel the routed experts of a block-scaled fp8 checkpoint run in by default at
    tp (``ServeSpec.fp8_scaling``): ``triton`` (vLLM's and SGLang's ``fused_moe``, priced at
    ``efficiency.serve_block_fp8`` where the device measures it); empty: the device's fp8
    rate (DeepGEMM's and CUTLASS's grouped kernels)."""
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Per field, where its value comes from (document or code, and the quoted line)."""

    def host_s(self, sequences: float) -> float:
        """Host seconds of one iteration holding ``sequences`` sequences (decoding or
        prefilling): what the device waits for and what runs beside it."""
        serial = self.step_s + self.seq_s * sequences
        return serial + self.async_step_s + self.async_seq_s * sequences

    def iteration_s(self, device: float, sequences: float) -> float:
        """An iteration's seconds from the device's: the host work it waits for, then the
        longer of the device and the host work that overlaps it."""
        serial = self.step_s + self.seq_s * sequences
        return serial + max(device, self.async_step_s + self.async_seq_s * sequences)

    def budget(self, positions: int) -> int:
        """Tokens an iteration may hold for a model of ``positions`` (its context length)."""
        return max(positions, self.token_budget) if self.whole_prompts else self.token_budget

    def memory_share(self, tp: int) -> float:
        """The share of device memory taken by default at tensor parallelism ``tp``."""
        return next((share for least, share in self.memory_by_tp if tp >= least),
                    self.memory_utilization)  # fmt: skip

    def attention_kernel(self, kernels: Iterable[str]) -> str:
        """The kernel family a prefill runs on a device whose profile measures ``kernels``
        (``Hardware.attention_kernels``): the engine's first choice it lists, else
        ``auto`` (the device's default)."""
        listed = set(kernels)
        return next((k for k in self.prefill_attention if k in listed), "auto")

    def cache_dtype(self, precision: str) -> str:
        """The cache dtype the engine serves ``precision`` weights with by default."""
        if precision in ("fp8", "nvfp4") and self.fp8_cache_with_fp8_weights:
            return "fp8"
        return "fp32" if precision == "fp32" else "fp16" if precision == "fp16" else "bf16"


ENGINES: dict[str, Engine] = {}


def register(kind: Engine) -> Engine:
    """Add ``kind`` under its name (one module per engine calls this)."""
    ENGINES[kind.name] = kind
    return kind


def engine(name: str) -> Engine:
    """The engine named ``name``; a SpecError naming the field otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise SpecError("engine", f"engine must be one of {', '.join(ENGINES)} "
                        f"(got {name!r})") from None  # fmt: skip


from costmodel.specs.engines import vllm, sglang, trtllm, reference  # noqa: E402, I001

__all__ = ["DEFAULT", "ENGINES", "Engine", "engine", "reference", "register", "sglang", "trtllm",
           "vllm"]  # fmt: skip
