"""Megatron-LM (Megatron-Core): bf16 parameters, main gradients in a buffer allocated once,
the distributed optimizer (fp32 master and Adam state over every data-parallel rank),
gradients reduce-scattered and updated parameters all-gathered in buckets, combined 1F1B
for expert-parallel all-to-alls.

The gradient buffer holds the dtype the gradients are reduced in: fp32 with
``--grad-reduce-in-fp32`` (``accumulate_allreduce_grads_in_fp32``), else the parameters'
(``param_and_grad_buffer.py``: ``grad_dtype = torch.float if grad_reduce_in_fp32 else
param.dtype``); a low-precision buffer's shard is made fp32 for the optimizer step
(``DistributedOptimizer._copy_model_grads_to_main_grads``: ``shard_main_param.grad =
shard_model_grad.float()``), a copy the next step's ``zero_grad(set_to_none=True)`` frees
before its forward, so it is alive in the optimizer step only (``step_grads``). Bytes per
parameter at the step: 6 + 12/d with fp32 gradients, 4 + 16/d with bf16 ones (Megatron-LM
docs, "Distributed Optimizer", its table's bf16/fp32 and fp16/fp16 rows); 4 + 12/d of them
through forward and backward with bf16 ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.frameworks.registry import Framework
from costmodel.parallel.pipeline import PipelineRank
from costmodel.parallel.shares import optimizer_shards
from costmodel.parallel.state import shard_of
from costmodel.single.precision import PRECISIONS
from costmodel.specs.frameworks import TRAITS
from costmodel.specs.model import ModelSpec, TrainSpec
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import X
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


class Megatron(Framework):
    """Megatron-Core with the distributed optimizer."""

    traits = TRAITS["megatron"]

    def state(
        self, model: ModelSpec, train: TrainSpec, par: ParallelSpec, rank: PipelineRank | None
    ) -> dict[str, sp.Expr]:
        """Low-precision parameters and the gradient buffer whole (fp32, or the parameters'
        dtype, with the fp32 copy of its shard the step makes as ``step_grads``), master and
        optimizer state over the data-parallel ranks; without a weight copy (pure bf16) the
        autocast state, but for the optimizer state, which the distributed optimizer shards
        all the same (as the step's time already counted it: ``optimizer_shards``). Under
        Megatron-FSDP (zero 3 over fsdp > 1: ``data_parallel_sharding_strategy``
        ``optim_grads_params``) the parameters and the gradient buffer are sharded over the
        fsdp ranks too, the running and the prefetched layer gathered beside them."""
        prec = PRECISIONS[train.precision]
        n, per_shard, opt = shard_of(model, train, par, rank)
        dp = optimizer_shards(par)
        if not prec.weight_copy:
            return {**super().state(model, train, par, rank), "optimizer": opt(dp)}
        if par.zero == 3:  # Megatron-FSDP: parameters and gradient buffer sharded as well
            grad = prec.grad if par.grad_reduce_fp32 else prec.activation
            return {"params": prec.activation * per_shard(X), "master": prec.param * per_shard(dp),
                    "grads": grad * per_shard(X), "optimizer": opt(dp)}  # fmt: skip
        grads, step_grads = prec.grad * n, integer(0)
        if not par.grad_reduce_fp32:
            grads, step_grads = prec.activation * n, prec.grad * per_shard(dp)
        return {"params": prec.activation * n, "master": prec.param * per_shard(dp),
                "grads": grads, "step_grads": step_grads, "optimizer": opt(dp)}  # fmt: skip


FRAMEWORK = Megatron()
