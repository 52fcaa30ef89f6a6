"""Megatron-LM (Megatron-Core): bf16 parameters, fp32 main gradients in a buffer allocated
once, the distributed optimizer (fp32 master and Adam state over every data-parallel rank:
6 + 12/d bytes per parameter; Megatron-LM docs, "Distributed Optimizer"), gradients
reduce-scattered and updated parameters all-gathered in buckets, combined 1F1B for
expert-parallel all-to-alls."""

from __future__ import annotations

import sympy as sp

from costmodel.frameworks.registry import Framework
from costmodel.parallel.pipeline import PipelineRank
from costmodel.parallel.shares import optimizer_shards
from costmodel.parallel.state import shard_of
from costmodel.single.precision import PRECISIONS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec


class Megatron(Framework):
    """Megatron-Core with the distributed optimizer."""

    name = "megatron"
    distributed_optimizer = True
    params_persist = True
    grads_always_live = True
    combined_1f1b = True
    expert_tensor_parallel = True

    def shardings(self, replicas: int) -> list[tuple[int, int, int]]:
        """Data parallelism with the distributed optimizer over every replica."""
        return [(replicas, 1, 1)]

    def state(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
    ) -> dict[str, sp.Expr]:
        """Low-precision parameters and fp32 gradients whole, master and optimizer state
        over the data-parallel ranks; without a weight copy the autocast state."""
        prec = PRECISIONS[train.precision]
        if not prec.weight_copy:
            return super().state(model, train, par, rank)
        n, per_shard, opt = shard_of(model, train, par, rank)
        dp = optimizer_shards(par)
        return {"params": prec.activation * n, "master": prec.param * per_shard(dp),
                "grads": prec.grad * n, "optimizer": opt(dp)}  # fmt: skip


FRAMEWORK = Megatron()
