"""The pipeline's rules on a layout (scalars or arrays, as the grid's masks): every
virtual stage holds a slot, the embedding and loss slots divide evenly where counted, the
bidirectional schedules' own conditions (DualPipe, DualPipeV), and the blocks the first
round of stages holds (``costmodel.parallel.pipeline`` prices the same split).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.specs import checks


def split_slots(par: Any) -> tuple[Any, Any]:
    """(embedding, loss) slots the pipeline split counts as layers: 0 or 1 each."""
    return (np.asarray(par.pp_split_embedding, dtype=int),
            np.asarray(par.pp_split_loss, dtype=int))  # fmt: skip


def pipeline_rule(par: Any, model: Any) -> None:
    """Every virtual stage holds at least one slot (a block, or the embedding or the loss
    where the split counts them as layers: Megatron-Core's pipeline layouts such as
    ``Et|(tt|)*30L`` give them stages of their own); with the embedding or the loss counted
    as a layer, the slots divide evenly over the pp * pp_interleave virtual stages
    (Megatron-Core's ``get_num_layers_to_build``: "num_layers should be divisible by
    pipeline_model_parallel_size", then by the virtual pipeline size), and those flags
    need pp > 1."""
    stages = np.asarray(par.pp) * np.asarray(par.pp_interleave)
    emb, loss = split_slots(par)
    slots = np.asarray(model.n_layers) + emb + loss
    counts = "n_layers + the embedding and loss slots" if (emb + loss).any() else "n_layers"
    checks.at_most("pp * pp_interleave", stages, counts, slots,
                   "(a virtual stage holds at least one layer, or the embedding or the loss "
                   "where pp_split_embedding or pp_split_loss counts it as one)",
                   field="pp")  # fmt: skip
    counted = (emb + loss) > 0
    dualpipe_rule(par)
    for name, flag in (("pp_split_embedding", emb), ("pp_split_loss", loss)):
        ok = (flag == 0) | (np.asarray(par.pp) > 1)
        checks.require(ok, name, lambda n=name: f"{n} needs pp > 1")
    ok = ~counted | (slots % stages == 0)
    checks.require(ok, "pp", lambda: "with the embedding or loss counted as a layer, "
                   "n_layers + those slots must divide over pp * pp_interleave (got "
                   f"{checks.pair(ok, slots, stages, 'slots', 'pp * pp_interleave')})")  # fmt: skip


def dualpipe_rule(par: Any, grad_accum: Any = None) -> None:
    """What the bidirectional schedules assert: DualPipe's ``step`` (deepseek-ai/DualPipe,
    ``dualpipe/dualpipe.py``) an even number of ranks, one stage per direction on each and,
    given ``grad_accum``, an even number of micro-batches, at least 2 pp (``num_chunks % 2
    == 0 and num_chunks >= num_ranks * 2``); torch's ``ScheduleDualPipeV`` two stages per
    rank ("ZBV requires exactly 2 stages per rank") and at least as many micro-batches as
    its 2 pp stages."""
    schedule = np.asarray(getattr(par, "pp_schedule", "1f1b"))
    dual, vee = schedule == "dualpipe", schedule == "dualpipev"
    if not (dual | vee).any():
        return
    pp, v = np.asarray(par.pp), np.asarray(par.pp_interleave)
    ok = ~(dual | vee) | (pp >= 2)
    checks.require(ok, "pp_schedule", lambda: f"pp_schedule={checks.first(ok, schedule)} feeds "
                   "micro-batches from both ends of the pipeline: it needs pp >= 2")  # fmt: skip
    ok = ~dual | (pp % 2 == 0)
    checks.require(ok, "pp_schedule", lambda: "pp_schedule=dualpipe pairs rank r with rank "
                   f"pp - 1 - r: it needs an even pp (got pp={checks.first(ok, pp)})")  # fmt: skip
    ok = (~dual | (v == 1)) & (~vee | (v == 2))
    checks.require(ok, "pp_interleave", lambda: "pp_schedule=dualpipe holds one stage per "
                   "direction on each rank (pp_interleave 1), dualpipev two stages in a V "
                   f"(pp_interleave 2) (got pp_interleave={checks.first(ok, v)})")  # fmt: skip
    if grad_accum is None:
        return
    m = np.asarray(grad_accum)
    ok = ~dual | (m % 2 == 0)
    checks.require(
        ok,
        "grad_accum",
        lambda: (
            "pp_schedule=dualpipe splits the micro-batches "
            f"over its two directions: grad_accum must be even (got {checks.first(ok, m)})"
        ),
    )
    ok = ~(dual | vee) | (m >= 2 * pp)
    checks.require(ok, "grad_accum", lambda: f"pp_schedule={checks.first(ok, schedule)} needs at "
                   "least 2 * pp micro-batches (got "
                   f"{checks.pair(ok, m, 2 * pp, 'grad_accum', '2 * pp')})")  # fmt: skip


def first_round_layers(par: Any, model: Any) -> Any:
    """Blocks the first pp virtual stages hold (``costmodel.parallel.pipeline``'s split:
    the earlier stages take the spare slots; the embedding's slot on the first stage, the
    loss's on the last)."""
    pp, v = np.asarray(par.pp), np.asarray(par.pp_interleave)
    emb, loss = split_slots(par)
    total = np.asarray(model.n_layers) + emb + loss
    per, extra = total // (pp * v), total % (pp * v)
    return pp * per + np.minimum(pp, extra) - emb - loss * (v == 1)
