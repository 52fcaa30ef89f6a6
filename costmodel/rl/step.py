"""One synchronous RL step of a policy (GRPO, PPO without a critic): generate the rollouts,
score them with forward passes, train the policy on them, send the new weights to the
rollout engine. Seconds per phase and the share of the step spent generating.

- **Generation** (:mod:`costmodel.rl.rollout`): ``prompts`` x ``samples`` responses over
  the rollout engines (``rollout_gpus`` / ``rollout_tp``), each engine running its share
  at once within its memory share (``RLSpec.engine_memory``) until its longest response
  ends; response lengths lognormal around ``output`` (``response_sigma``), cut at
  ``max_output``.
- **Scoring**: one forward pass over the batch per model that scores it: the old policy's
  log-probabilities (PPO's ratio) and the reference model's (the KL term), each the
  training estimate's forward time.
- **Training** (``costmodel.estimate``): ``minibatches`` optimizer steps over the batch of
  ``input`` + mean-response-token sequences on the training GPUs, laid out as the trainer
  runs them (``framework``, ``train_tp``, ``train_pp``, ``train_ep``): one sequence per
  micro-batch, or as many as ``pack_tokens`` holds (sequence packing; attention is priced
  per sequence, as varlen kernels run it), each mini-batch rounded up to whole
  micro-batches on every data-parallel rank.
- **Weight sync**: the policy's bf16 weights to the rollout engine, colocated over the
  node's links (each GPU gathers its tp shard from the trainer's shards), separate over the
  network (each rollout GPU receives its shard).
- **Step**: colocated and separate pools run the phases one after another (on-policy);
  ``async`` (one step off-policy, as AReaL and verl's one-step-off) overlaps generation with
  scoring and training: the step is the longer of the two, plus the sync.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from costmodel.api import estimate
from costmodel.catalog.hardware import get_hardware
from costmodel.catalog.presets import get_model
from costmodel.engine.fit import budget_bytes, fits
from costmodel.rl import rollout
from costmodel.rl.spec import RLSpec
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec
from costmodel.specs.serving import ServeSpec
from costmodel.specs.serving_device import check


def response_cap(model: ModelSpec, spec: RLSpec, engine: ServeSpec, hw: Hardware) -> int:
    """The longest response (``RLSpec.max_output``, or its default: ``output`` when every
    response is that long, else the model's positions after the prompt), checked as
    ``costmodel.serving`` checks a context: within the model's positions, as the engine's
    ``max_model_len`` is (the error says what RoPE scaling would allow)."""
    positions = int(model.max_positions * spec.rope_scaling)
    default = spec.output if spec.response_sigma == 0 else positions - spec.input
    cap = spec.max_output or default
    field = "max_output" if spec.max_output else "output"
    try:
        check(model, replace(engine, output=max(cap, spec.output)), hw)
    except SpecError as err:
        raise SpecError(field, f"{field}: {err}") from None
    return cap


def _generation(model: ModelSpec, spec: RLSpec, hw: Hardware) -> dict[str, Any]:
    gen, _ = spec.pools()
    replicas = gen // spec.rollout_tp
    engine = ServeSpec(input=spec.input, output=spec.output, tp=spec.rollout_tp,
                       engine=spec.rollout_engine, rope_scaling=spec.rope_scaling,
                       memory_utilization=spec.engine_memory())  # fmt: skip
    cap = response_cap(model, spec, engine, hw)
    capacity = rollout.kv_capacity_tokens(model, engine, hw)
    if capacity <= spec.input:
        field = "rollout_memory" if spec.rollout_memory is not None else "rollout_tp"
        raise SpecError(field, f"{field}: the policy's weights and one prompt do not fit "
                        f"{spec.engine_memory():g} of {spec.rollout_tp} x {hw.name}; raise "
                        "rollout_memory or rollout_tp")  # fmt: skip
    lengths = rollout.response_lengths(spec.prompts * spec.samples, spec.output,
                                       spec.response_sigma, cap)  # fmt: skip
    run = rollout.simulate(model, engine, hw, rollout.engine_share(lengths, replicas), capacity)
    return {"rl.generation_s": run.seconds, "rl.rollout_prefill_s": run.prefill_s,
            "rl.rollout_replicas": replicas, "rl.rollout_peak_batch": run.peak_running,
            "rl.rollout_iterations": run.iterations, "rl.rollout_preemptions": run.preemptions,
            "rl.response_mean": float(lengths.mean()),
            "rl.response_longest": run.longest}  # fmt: skip


def training_estimate(
    model: str | ModelSpec, spec: RLSpec, hardware: str, mean_response: float
) -> Any:
    """The estimate of one of the step's ``minibatches`` optimizer steps (module docstring)."""
    _, train_gpus = spec.pools()
    sequences = spec.prompts * spec.samples // spec.minibatches
    seq = spec.input + max(1, round(mean_response))
    if spec.sequence_parallel:  # padded to a multiple of tp (NeMo RL's and Megatron's rule)
        seq = math.ceil(seq / spec.train_tp) * spec.train_tp
    ranks = train_gpus // (spec.train_tp * spec.train_pp)
    micro = max(1, spec.pack_tokens // seq) if spec.pack_tokens else 1
    micro = min(micro, math.ceil(sequences / ranks))  # a pack holds at most a rank's share
    batch = math.ceil(sequences / (micro * ranks)) * micro * ranks
    layout = {"tp": spec.train_tp, "pp": spec.train_pp,
              "sequence_parallel": spec.sequence_parallel}  # fmt: skip
    if spec.train_ep > 1:
        layout["ep"] = spec.train_ep
    return estimate(model, hardware=hardware, gpus=train_gpus, batch=batch, seq=seq,
                    microbatch=micro, framework=spec.framework,
                    recompute=spec.train_recompute, **layout)  # fmt: skip


def rl_step(model: str | ModelSpec, spec: RLSpec, hardware: str) -> dict[str, Any]:
    """The step's phases (module docstring), by dotted name: seconds, GPUs, the share.
    ``model``: a preset's name or a ModelSpec (e.g. ``costmodel.from_hf``'s)."""
    model = get_model(model) if isinstance(model, str) else model
    if spec.train_ep > 1 and model.n_experts == 0:
        raise SpecError("train_ep", f"train_ep > 1 needs a mixture-of-experts model; "
                        f"{model.name} has no experts (got train_ep={spec.train_ep})")  # fmt: skip
    hw = get_hardware(hardware)
    out = _generation(model, spec, hw)
    gen_gpus, train_gpus = spec.pools()
    est = training_estimate(model, spec, hardware, out["rl.response_mean"])
    steps = spec.minibatches
    scoring = steps * est["time_s.forward"] * (int(spec.reference) + int(spec.old_logprobs))
    weights = 2 * est["params.total"]  # bf16
    if spec.placement == "colocated":
        sync = weights / spec.rollout_tp / (hw.link_bw * hw.eff("link"))
    else:
        sync = weights / spec.rollout_tp / (hw.network_bw * hw.eff("network"))
    train = steps * est["time_s.step"]
    if spec.placement == "async":
        step = max(out["rl.generation_s"], scoring + train) + sync
    else:
        step = out["rl.generation_s"] + scoring + train + sync
    out.update({
        "rl.scoring_s": scoring, "rl.train_s": train, "rl.weight_sync_s": sync,
        "rl.step_s": step, "rl.generation_share": out["rl.generation_s"] / step,
        "rl.train_gpus": train_gpus, "rl.rollout_gpus": gen_gpus,
        "rl.train_fits": fits(est.values, budget_bytes(hw)),
        "rl.train_budget_bytes": budget_bytes(hw),
        "rl.train_peak_bytes": est["memory_bytes_per_device.peak"],
        "rl.train_micro_batch": est.train.batch // est.parallel.batch_step(est.train.grad_accum),
        "rl.tokens_per_s": spec.prompts * spec.samples
        * (spec.input + out["rl.response_mean"]) / step,
    })  # fmt: skip
    return out
