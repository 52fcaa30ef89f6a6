"""What an answer notes of the inputs it took: defaults it chose as the framework would
(the sequence, the batch, the micro-batch, the sharding), a pipeline's bubble, tp placed
as no framework places it, and inputs given that change nothing here. The CLI prints them
as ``note`` lines, the app beside its assumptions, the API in ``Estimate.notes``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from costmodel.specs.frameworks import trait
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec


def seq_note(
    values: Mapping[str, Any], model: ModelSpec, train: TrainSpec, solving: str | None
) -> tuple[str, ...]:
    """A sequence length not given: the default, said with the model's own positions (a
    model trained at 8,192 priced at 1,024 looks far lighter than its training run)."""
    if values.get("seq") is not None or solving == "seq":
        return ()
    trained = f" (the model takes up to {model.max_positions:,})" if model.max_positions else ""
    return (f"seq {train.seq:,} tokens, the default{trained}: set --seq to change",)


def layout_notes(
    train: TrainSpec,
    par: ParallelSpec,
    *,
    micro_default: bool,
    shard_default: bool,
    batch_default: bool = False,
) -> tuple[str, ...]:
    """What :func:`build` chose as the framework would, and a pipeline's bubble warning."""
    notes = []
    if batch_default:
        notes.append(f"batch {train.batch} sequences of {train.seq} tokens per step "
                     "(set --batch to change)")  # fmt: skip
    if micro_default and train.grad_accum > 1:
        notes.append(f"micro-batch 1 per device, {train.grad_accum} accumulation steps "
                     "(set --microbatch or --grad-accum to change)")  # fmt: skip
    if shard_default and par.fsdp > 1:
        notes.append(f"{par.framework} shards over all {par.fsdp} data-parallel devices "
                     "(set --fsdp or --dp to change)")  # fmt: skip
    if par.ep_routing != "random" and par.ep_dispatcher == "all-to-all":
        notes.append(f"--ep-routing {par.ep_routing} changes nothing under the all-to-all "
                     "dispatcher, which sends one copy per routed pair whatever the spread "
                     "(--ep-dispatcher deepep sends one per destination rank)")  # fmt: skip
    if par.pp > 1 and train.grad_accum < par.pp:
        micro = train.batch // par.batch_step(train.grad_accum)
        how = "raise --grad-accum or lower --microbatch" if micro > 1 else (
            "a larger --batch gives more micro-batches of one sequence")  # fmt: skip
        m = train.grad_accum
        idle = (par.pp - m) / par.pp  # (pp - m) of the pp + ... slots
        notes.append(f"{m:,} micro-batch{'es' * (m != 1)} for {par.pp} pipeline stages: "
                     f"each stage idles {idle:.0%} of the step or more in the pipeline "
                     f"bubble, interleaved or not ({how})")  # fmt: skip
    return tuple(notes)


def placement_notes(spec: ModelSpec, parallel: ParallelSpec, hardware: Hardware) -> tuple:
    """Where tp is placed as frameworks would not place it: across nodes, or over more
    ranks than the KV heads."""
    notes: tuple[str, ...] = ()
    if hardware.kind == "gpu" and parallel.tp > hardware.devices_per_node:
        nodes = -(-parallel.tp // hardware.devices_per_node)
        notes = (*notes, f"tp {parallel.tp} spans {nodes} nodes of {hardware.devices_per_node} "
                 "GPUs: its collectives cross the network, priced at its bandwidth (training "
                 "frameworks keep tp within a node)")  # fmt: skip
    if not spec.ffn_only and parallel.tp > spec.n_kv_heads:
        notes = (*notes, f"tp {parallel.tp} is more than the {spec.n_kv_heads} KV heads: "
                 f"each is replicated over {parallel.tp // spec.n_kv_heads} ranks, as vLLM "
                 "serves them; Megatron-Core and torchtitan train with tp dividing the KV "
                 "heads")  # fmt: skip
    return notes


def unused_notes(
    values: Mapping[str, Any], train: TrainSpec, parallel: ParallelSpec, price: float | None
) -> tuple:
    """Notes for inputs given that change nothing here: a price without a token budget,
    a bucket size where no data-parallel all-reduce is bucketed, a fused kernel's name
    under naive attention (probes: each was ignored unsaid)."""
    said: tuple[str, ...] = ()
    if values.get("attention_kernel") is not None and train.attention != "flash":
        said += (f"--attention-kernel {values['attention_kernel']} names a fused kernel: "
                 f"attention {train.attention} runs none, so it changes nothing",)  # fmt: skip
    if price:
        said += (f"--price-per-hour {price:g} prices a token budget: give --token-budget "
                 "for the days and the cost",)  # fmt: skip
    if values.get("bucket_mb") is not None and (
        parallel.dp == 1 or trait(parallel.framework, "distributed_optimizer")
    ):
        said += (f"--bucket-mb {values['bucket_mb']:g} sizes the buckets of a data-parallel "
                 "all-reduce between replicas (dp > 1; Megatron's distributed optimizer "
                 "sizes its own): this layout has none, so it changes nothing",)  # fmt: skip
    return said
