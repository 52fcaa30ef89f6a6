"""DeepSpeed's ZeRO 1/2/3 over fsdp with its bf16 engine: bf16 parameters and gradients,
fp32 master weights and Adam state, each sharded by its stage (Rajbhandari et al. 2020,
Sec. 5); the running and the prefetched layer gathered under ZeRO-3."""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.frameworks.registry import Framework
from costmodel.parallel.pipeline import PipelineRank
from costmodel.parallel.state import shard_of
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import TRAITS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import X

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


class DeepSpeed(Framework):
    """DeepSpeed's ZeRO engine."""

    traits = TRAITS["deepspeed"]

    def state(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
    ) -> dict[str, sp.Expr]:
        """Low-precision parameters (sharded under ZeRO-3) and gradients (under ZeRO-2 and
        3), fp32 master and optimizer state over X; without a weight copy (fp32, pure
        bf16) the autocast state."""
        prec = PRECISIONS[train.precision]
        if not prec.weight_copy:
            return super().state(model, train, par, rank)
        _, per_shard, opt = shard_of(model, train, par, rank)
        low = prec.activation
        p_sh, g_sh = (X if par.zero == 3 else 1), (X if par.zero >= 2 else 1)
        return {"params": low * per_shard(p_sh), "master": prec.param * per_shard(X),
                "grads": low * per_shard(g_sh), "optimizer": opt(X)}  # fmt: skip


FRAMEWORK = DeepSpeed()
