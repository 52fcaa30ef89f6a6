"""One synchronous RL step of a policy (GRPO, PPO without a critic): generate the rollouts,
score them with forward passes, train the policy on them, send the new weights to the
rollout engine. Seconds per phase and the share of the step spent generating.

- **Generation** (``costmodel.serve``): ``prompts`` x ``samples`` sequences of ``input``
  prompt and ``output`` response tokens over the rollout replicas (``rollout_gpus`` /
  ``rollout_tp``); each replica runs its share in waves of the largest batch that fits its
  memory (colocated: ``COLOCATED_MEMORY`` of it), each wave one batch's end-to-end time.
  Mean lengths: a long tail of responses makes a real wave wait for its longest (stated,
  not modelled).
- **Scoring**: one forward pass over the batch per model that scores it: the old policy's
  log-probabilities (PPO's ratio) and the reference model's (the KL term), each the
  training estimate's forward time.
- **Training** (``costmodel.estimate``): one optimizer step over the batch of
  ``input + output``-token sequences on ``train_gpus`` as the CLI lays it out (FSDP2 over
  all of them, micro-batch 1).
- **Weight sync**: the policy's bf16 weights to the rollout engine, colocated over the
  node's links (each GPU gathers its tp shard from the FSDP shards), separate over the
  network (each rollout GPU receives its shard).
- **Step**: colocated and separate pools run the phases one after another (on-policy);
  ``async`` (one step off-policy, as AReaL and verl's one-step-off) overlaps generation with
  scoring and training: the step is the longer of the two, plus the sync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from costmodel.api import estimate
from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.engine.fit import budget_bytes, fits
from costmodel.serve import serve
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.serving import ServeSpec

PLACEMENTS = ("colocated", "separate", "async")
COLOCATED_MEMORY = 0.5
"""Share of a GPU the rollout engine takes beside the trainer's (offloaded) state: verl's
``actor_rollout_ref.rollout.gpu_memory_utilization`` default; separate pools take vLLM's 0.9."""


@dataclass(frozen=True, kw_only=True)
class RLSpec:
    """One RL step's sizes and layout (tokens, sequences, GPUs)."""

    prompts: int
    samples: int = 8
    input: int
    output: int
    gpus: int
    placement: str = "colocated"
    rollout_gpus: int = 0
    """Separate pools: GPUs that generate (0: half); colocated: all of them."""
    rollout_tp: int = 1
    reference: bool = True
    """A reference model scores the rollouts (the KL term)."""
    old_logprobs: bool = True
    """The old policy scores them (PPO's ratio over several mini-batches)."""

    def __post_init__(self) -> None:
        for name in ("prompts", "samples", "input", "output", "gpus", "rollout_tp"):
            checks.integer(name, getattr(self, name))
        checks.integer("rollout_gpus", self.rollout_gpus, minimum=0)
        checks.choice("placement", self.placement, PLACEMENTS)
        gen = self.pools()[0]
        if self.placement != "colocated" and not 0 < gen < self.gpus:
            raise SpecError("rollout_gpus", f"rollout_gpus must be in [1, {self.gpus - 1}] for "
                            f"separate pools (got {gen})")  # fmt: skip
        checks.divides("rollout_tp", self.rollout_tp, "rollout GPUs", gen)
        train = self.pools()[1]
        if self.prompts * self.samples % train:  # FSDP2 over them, a micro-batch of 1 each
            raise SpecError("gpus", f"gpus: the {train} training GPUs must divide the "
                            f"{self.prompts * self.samples} sequences of a step (prompts x "
                            "samples)")  # fmt: skip

    def pools(self) -> tuple[int, int]:
        """(GPUs that generate, GPUs that train)."""
        if self.placement == "colocated":
            return self.gpus, self.gpus
        gen = self.rollout_gpus or self.gpus // 2
        return gen, self.gpus - gen


def _generation(model: Any, spec: RLSpec, hw: Any) -> dict[str, Any]:
    gen, _ = spec.pools()
    replicas = gen // spec.rollout_tp
    share = math.ceil(spec.prompts * spec.samples / replicas)
    share_of_memory = COLOCATED_MEMORY if spec.placement == "colocated" else 0.9
    base = ServeSpec(input=spec.input, output=spec.output, tp=spec.rollout_tp,
                     memory_utilization=share_of_memory)  # fmt: skip
    most = serve(model, base, hw)["max_batch"]
    if most < 1:
        raise SpecError("rollout_tp", f"rollout_tp {spec.rollout_tp}: the policy's weights do "
                        f"not fit {spec.rollout_tp} x {hw.name}; raise it")  # fmt: skip
    batch = min(share, most)
    waves = math.ceil(share / batch)
    wave = serve(model, replace(base, batch=batch), hw)
    return {"rl.generation_s": waves * wave["time_s.e2e"], "rl.rollout_batch": batch,
            "rl.rollout_waves": waves, "rl.rollout_replicas": replicas}  # fmt: skip


def rl_step(model_name: str, spec: RLSpec, hardware: str) -> dict[str, Any]:
    """The step's phases (module docstring), by dotted name: seconds, GPUs, the share."""
    model, hw = get_model(model_name), get_hardware(hardware)
    out = _generation(model, spec, hw)
    gen_gpus, train_gpus = spec.pools()
    est = estimate(model_name, hardware=hardware, gpus=train_gpus,
                   batch=spec.prompts * spec.samples, seq=spec.input + spec.output,
                   framework="fsdp2")  # fmt: skip
    forward = est["time_s.forward"]
    scoring = forward * (int(spec.reference) + int(spec.old_logprobs))
    weights = 2 * est["params.total"]  # bf16
    if spec.placement == "colocated":
        sync = weights / spec.rollout_tp / (hw.link_bw * hw.eff("link"))
    else:
        sync = weights / spec.rollout_tp / (hw.network_bw * hw.eff("network"))
    train = est["time_s.step"]
    if spec.placement == "async":
        step = max(out["rl.generation_s"], scoring + train) + sync
    else:
        step = out["rl.generation_s"] + scoring + train + sync
    peak = est["memory_bytes_per_device.peak"]
    budget = budget_bytes(hw)
    out.update({
        "rl.scoring_s": scoring, "rl.train_s": train, "rl.weight_sync_s": sync,
        "rl.step_s": step, "rl.generation_share": out["rl.generation_s"] / step,
        "rl.train_gpus": train_gpus, "rl.rollout_gpus": gen_gpus,
        "rl.train_fits": fits(est.values, budget),
        "rl.train_peak_bytes": peak,
        "rl.tokens_per_s": spec.prompts * spec.samples * (spec.input + spec.output) / step,
    })  # fmt: skip
    return out
