"""One configuration, checked once: every rule between a model, its training and its layout.

:func:`check` is the rule table. ``estimate``, ``sweep``, the planner, the inverse
questions, the inputs behind the CLI and the app, and the published-run mapping all call it,
on specs (scalars) or on namespaces whose fields are numpy arrays (a sweep's group, the
planner's candidates): a rule fails when any point does, naming the field and quoting the
first point that fails, or inside ``checks.collect_masks()`` records which points pass.
A field's own constraints (types, ranges, choices) are the specs' ``__post_init__``; what a
framework refuses is its ``Traits.rules`` (``costmodel.specs.frameworks``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.specs import checks
from costmodel.specs.attention import window_rules
from costmodel.specs.finetune import finetune_rules
from costmodel.specs.frameworks import TRAITS, each, fixed_stage, trait
from costmodel.specs.parallel import cp_rule, layout_rules
from costmodel.specs.rules import (
    check_positions,
    model_rules,
    moe_rules,
    moe_train_rule,
    recompute_rule,
    train_rules,
)


def check(model: Any, train: Any, par: Any = None) -> None:
    """Every rule between fields, in one order for every entry point (so an invalid
    configuration is refused by all of them naming the same field)."""
    model_rules(n_heads=model.n_heads, n_kv_heads=model.n_kv_heads, head_dim=model.head_dim,
                pos=model.pos)  # fmt: skip
    moe_rules(model)
    train_rules(batch=train.batch, grad_accum=train.grad_accum)
    check_positions(model.pos, train.seq, model.max_positions)
    moe_train_rule(model, train.recompute, train.elementwise)
    recompute_rule(model, train)
    finetune_rules(model, train)
    window_rules(model, par)
    if par is None:
        return
    expert_tp_rule(par, model)
    layout_rules(par, model, seq=train.seq, batch=train.batch, grad_accum=train.grad_accum,
                 shards_over_cp=trait(par.framework, "shards_over_cp"))  # fmt: skip
    cp_rule(par.cp, train.attention)
    framework_rules(par, model, train)


def expert_tp_rule(par: Any, model: Any) -> None:
    """Tensor parallelism on an MoE model, or experts on a mesh of their own (etp), only
    under a framework that runs them (trait ``expert_tensor_parallel``)."""
    moe = np.asarray(getattr(model, "n_experts", 0)) > 0
    folded = (np.asarray(par.tp) > 1) | (np.asarray(par.etp) != np.asarray(par.tp))
    ok = ~moe | ~folded | trait(par.framework, "expert_tensor_parallel")
    running = " or ".join(t.name for t in TRAITS.values() if t.expert_tensor_parallel)
    checks.require(ok, "tp", lambda: "tp > 1 (or an etp of its own) on a mixture-of-experts "
                   f"model is modelled under framework={running} (expert tensor parallelism, "
                   f"MoE parallel folding); under {checks.first(ok, par.framework)} use ep, fsdp, "
                   "dp, cp or pp")  # fmt: skip


def framework_rules(par: Any, model: Any, train: Any) -> None:
    """What the named framework runs: fine-tuning, MoE models and combined 1F1B only
    where its traits say so, then its own rules (``Traits.rules``)."""
    finetune_rule(par, train.finetune)
    moe = np.asarray(getattr(model, "n_experts", 0)) > 0
    ok = ~moe | trait(par.framework, "runs_moe")
    checks.require(ok, "framework", lambda: f"framework={checks.first(ok, par.framework)} does not "
                   "run mixture-of-experts models")  # fmt: skip
    ep_overlap_rule(par, train.recompute)
    for framework, where in each(par.framework):
        zero_rule(framework, par, where)
        framework.rules(par, model, train, where)


def zero_rule(framework: Any, par: Any, where: Any) -> None:
    """A framework that shards its own way (no ``zero_stages``) runs its own stage
    (``Traits.own_stage``, what an unset ``zero`` is); any other stage is refused,
    naming how it shards."""
    own = fixed_stage(framework.name, np.asarray(par.fsdp))
    if own is None:
        return
    zero = np.asarray(par.zero)
    ok = ~np.asarray(where, dtype=bool) | (zero == own)
    checks.require(ok, "zero", lambda: f"framework={framework.name} shards as "
                   f"{framework.sharding}: zero must be {checks.first(ok, own)} (got "
                   f"{checks.first(ok, zero)}); --zero picks a stage under deepspeed and "
                   "reference")  # fmt: skip


def finetune_rule(par: Any, finetune: str) -> None:
    """LoRA and QLoRA are costed on one device and under data parallelism with ZeRO over
    the reference model (DDP, or FSDP sharding frozen and trained weights alike: the
    adapters' gradients reduced, the frozen weights gathered under ZeRO-3): how tensor,
    pipeline, context and expert parallelism split frozen and quantized weights, and the
    other frameworks' buffers, are not modelled."""
    if finetune == "full":
        return
    for name in ("tp", "pp", "cp", "ep"):
        degree = np.asarray(getattr(par, name, 1))
        checks.require(degree == 1, name, lambda n=name, d=degree: f"finetune={finetune} is "
                       "modelled on one device and under data parallelism (dp, fsdp): "
                       f"{n} must be 1 (got {np.max(d)})")  # fmt: skip
    ok = trait(par.framework, "finetunes")
    checks.require(ok, "framework", lambda: f"finetune={finetune} is modelled for "
                   "framework=reference (torch DDP, or ZeRO over fsdp)")  # fmt: skip


def ep_overlap_rule(par: Any, recompute: Any) -> None:
    """What Megatron-Core runs combined 1F1B with (its ``TransformerConfig`` checks): expert
    parallelism to hide, a framework that has it, pp = 1 or interleaved pipelining (plain
    1F1B has no schedule for it) and no full recomputation (a checkpointed block cannot be
    split into the nodes the two streams interleave)."""
    off = ~np.asarray(getattr(par, "ep_overlap", False), dtype=bool)
    if np.all(off):
        return
    ep = np.asarray(par.ep)
    checks.require(off | (ep > 1), "ep_overlap", lambda: "ep_overlap hides expert-parallel "
                   f"all-to-alls: it needs ep > 1 (got ep={np.min(ep)})")  # fmt: skip
    ok = off | trait(par.framework, "combined_1f1b")
    checks.require(ok, "ep_overlap", lambda: "ep_overlap is Megatron-Core's combined 1F1B: "
                   "it needs framework=megatron")  # fmt: skip
    ok = off | (np.asarray(par.pp) == 1) | (np.asarray(par.pp_interleave) > 1)
    checks.require(ok, "ep_overlap", lambda: "ep_overlap needs pp = 1 or interleaved "
                   "pipelining (pp_interleave > 1): 1F1B has no combined schedule")  # fmt: skip
    ok = off | (np.asarray(recompute) != "full")
    checks.require(ok, "recompute", lambda: "ep_overlap (combined 1F1B) does not run with "
                   "recompute=full: use none or selective")  # fmt: skip
