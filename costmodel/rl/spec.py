"""One RL step's inputs (:class:`RLSpec`), checked once: the rollout's sizes and engines,
the response lengths' spread, the trainer's layout, and where each runs."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.engines import DEFAULT as DEFAULT_ENGINE
from costmodel.specs.engines import ENGINES
from costmodel.specs.fields import document_fields
from costmodel.specs.model import RECOMPUTE_POLICIES
from costmodel.specs.parallel import FRAMEWORKS
from costmodel.specs.serving import check_rope_scaling

PLACEMENTS = ("colocated", "separate", "async")
COLOCATED_MEMORY = 0.5
"""Share of a GPU the rollout engine takes beside the trainer's (offloaded) state: verl's
``actor_rollout_ref.rollout.gpu_memory_utilization`` default; separate pools take
``SEPARATE_MEMORY``."""
MAX_SEQUENCES = 65_536
"""The most sequences (prompts x samples) one step takes: the rollout simulates each one
(:mod:`costmodel.rl.rollout`); 4x the largest published steps (DAPO's 512 x 16, 1,024 x 16)."""
SEPARATE_MEMORY = 0.9
"""vLLM's ``gpu_memory_utilization`` default, for an engine with its GPUs to itself."""
REASONING_SIGMA = 1.0
"""The log-space spread of reasoning-RL response lengths: lognormal with a median near 500
and a 99th percentile near 5,000 tokens (ln 10 / 2.33), the figure J. Lin's "Long-tail
rollouts" lesson (jiahuanglin.xyz, RL lessons 22b) gives for a typical run, an illustration
rather than a measurement; what ``--response-sigma`` is suggested as where a run's spread is
unknown, not a default. On NeMo-RL v0.3's published steps it prices the generation share
within 13.8 % (median; ``python -m validate.published.rl``)."""


@dataclass(frozen=True, kw_only=True)
class RLSpec:
    """One RL step's sizes and layout (tokens, sequences, GPUs)."""

    prompts: int
    samples: int = 8
    input: int
    output: int
    """Mean response tokens."""
    gpus: int
    placement: str = "colocated"
    rollout_gpus: int = 0
    """Separate pools: GPUs that generate (0: half); colocated: all of them."""
    rollout_tp: int = 1
    rollout_engine: str = DEFAULT_ENGINE
    """The rollout's serving engine (``costmodel.specs.engines``: vllm by generation,
    sglang, trtllm): its host time per iteration and its most sequences at once."""
    rollout_memory: float | None = None
    """Share of a rollout GPU's memory its engine takes (vLLM's ``gpu_memory_utilization``,
    in (0, 1]); None: ``COLOCATED_MEMORY`` colocated, ``SEPARATE_MEMORY`` on a pool of its
    own."""
    response_sigma: float = 0.0
    """Log-space spread of the response lengths (lognormal with mean ``output``,
    :mod:`costmodel.rl.rollout`); 0: every response ``output`` tokens."""
    max_output: int = 0
    """The longest a response may run (the sampler's ``max_new_tokens``, or the context
    ``max_model_len`` leaves after the prompt); 0: ``output`` when every response is that
    long, else the model's positions after the prompt."""
    reference: bool = True
    """A reference model scores the rollouts (the KL term)."""
    old_logprobs: bool = True
    """The old policy scores them (PPO's ratio over several mini-batches)."""
    framework: str = "fsdp2"
    """The trainer (``costmodel.frameworks``): FSDP2 shards over the data-parallel GPUs,
    Megatron keeps replicas with a distributed optimizer."""
    train_tp: int = 1
    train_pp: int = 1
    train_ep: int = 1
    train_recompute: str = "none"
    """The trainer's activation recomputation (``TrainSpec.recompute``: none, selective,
    selective-op, full; verl's ``enable_gradient_checkpointing``, NeMo RL's
    ``activation_checkpointing``)."""
    sequence_parallel: bool = False
    """The trainer's tp ranks split the sequence outside the matmuls (Megatron's
    ``sequence_parallel``; required for a mixture-of-experts model under tp > 1)."""
    pack_tokens: int = 0
    """Tokens of a packed training micro-batch (sequence packing, or dynamic batching to a
    token budget: NeMo RL's ``train_mb_tokens``, verl's ``ppo_max_token_len_per_gpu``); 0:
    one sequence per micro-batch."""
    minibatches: int = 1
    """Optimizer steps per RL step: the rollout batch over the training global batch."""
    rope_scaling: float = 1.0
    """The factor the rollout engine stretches the model's RoPE positions by (YaRN;
    ``ServeSpec.rope_scaling``): what a response past the model's positions needs."""

    def __post_init__(self) -> None:
        for name in ("prompts", "samples", "input", "output", "gpus", "rollout_tp", "train_tp",
                     "train_pp", "train_ep", "minibatches"):  # fmt: skip
            checks.integer(name, getattr(self, name))
        for name in ("rollout_gpus", "max_output", "pack_tokens"):
            checks.integer(name, getattr(self, name), minimum=0)
        checks.choice("placement", self.placement, PLACEMENTS)
        checks.choice("rollout_engine", self.rollout_engine, ENGINES)
        checks.choice("framework", self.framework, FRAMEWORKS)
        checks.choice("train_recompute", self.train_recompute, RECOMPUTE_POLICIES)
        check_rope_scaling(self.rope_scaling)
        checks.number("response_sigma", self.response_sigma, allow_zero=True)
        checks.at_most("response_sigma", self.response_sigma, "10",
                       10, "(a log-space spread: 10 already puts the longest response e^20 "
                       "times past the median)")  # fmt: skip
        if self.rollout_memory is not None:  # a share given: positive, at most the GPU
            checks.number("rollout_memory", self.rollout_memory)
            checks.at_most("rollout_memory", self.rollout_memory, "1", 1)
        if self.max_output and self.output > self.max_output:
            raise SpecError("output", f"output (the mean response, {self.output}) must be at "
                            f"most max_output ({self.max_output})")  # fmt: skip
        longest = self.input + (self.max_output or self.output)
        if self.pack_tokens and self.pack_tokens < longest:
            bound = "max_output" if self.max_output else "output"
            raise SpecError("pack_tokens", f"pack_tokens ({self.pack_tokens:,}) must hold the "
                            f"longest sequence, input + {bound} = {longest:,} tokens (0: no "
                            "packing)")  # fmt: skip
        if self.placement == "colocated" and self.rollout_gpus not in (0, self.gpus):
            raise SpecError("rollout_gpus", f"rollout_gpus ({self.rollout_gpus}) applies to "
                            "separate pools: colocated, every one of the "
                            f"{self.gpus} GPUs generates (give placement separate)")  # fmt: skip
        gen, train = self.pools()
        if self.placement != "colocated" and self.gpus < 2:
            raise SpecError("gpus", f"separate pools need at least 2 GPUs, one generating and "
                            f"one training (got gpus {self.gpus}; placement colocated runs "
                            "both on the same GPUs)")  # fmt: skip
        if self.placement != "colocated" and not 0 < gen < self.gpus:
            raise SpecError("rollout_gpus", f"rollout_gpus must be in [1, {self.gpus - 1}] for "
                            f"separate pools (got {gen})")  # fmt: skip
        checks.divides("rollout_tp", self.rollout_tp, "rollout GPUs", gen)
        model_parallel = self.train_tp * self.train_pp
        if train % model_parallel:
            raise SpecError("train_tp", f"train_tp x train_pp ({model_parallel}) must divide "
                            f"the {train} training GPUs")  # fmt: skip
        sequences = self.prompts * self.samples
        checks.at_most("prompts x samples", sequences, f"{MAX_SEQUENCES:,}", MAX_SEQUENCES,
                       "(sequences of one step; published RL steps run up to 16,384)",
                       field="prompts")  # fmt: skip
        if sequences % self.minibatches:
            raise SpecError("minibatches", f"minibatches ({self.minibatches}) must divide the "
                            f"{sequences} sequences of a step (prompts x samples)")  # fmt: skip
        ranks = train // model_parallel
        if not self.pack_tokens and sequences // self.minibatches % ranks:
            raise SpecError("gpus", f"gpus: the {ranks} data-parallel training ranks must divide "
                            f"the {sequences // self.minibatches} sequences of a mini-batch "
                            "(prompts x samples / minibatches), one per micro-batch; or "
                            "pack them (pack_tokens)")  # fmt: skip

    def pools(self) -> tuple[int, int]:
        """(GPUs that generate, GPUs that train)."""
        if self.placement == "colocated":
            return self.gpus, self.gpus
        gen = self.rollout_gpus or self.gpus // 2
        return gen, self.gpus - gen

    def engine_memory(self) -> float:
        """The rollout engine's share of a GPU's memory (``rollout_memory``)."""
        if self.rollout_memory is not None:
            return self.rollout_memory
        return COLOCATED_MEMORY if self.placement == "colocated" else SEPARATE_MEMORY


document_fields(RLSpec)
