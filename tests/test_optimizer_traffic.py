"""costmodel's optimizer memory traffic against the bytes torch's optimizer ops touch.

A dispatch mode reads each op's schema: every distinct parameter-sized tensor argument is
read once; arguments the schema marks as written (or, for out-of-place ops, the outputs)
are written once. The fused kernels' schemas mark ``grads`` as written because they unscale
them in place under a GradScaler; without one they only read them, so that write is not
counted.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from costmodel.single.precision import optimizer_traffic
from costmodel.specs.model import OPTIMIZER_IMPLS, TrainSpec
from validate.probes.accounting import make_optimizer

N = 4096


def _sized(tree) -> dict[int, int]:
    return {
        t.untyped_storage()._cdata: t.nbytes
        for t in tree_flatten(tree)[0]
        if isinstance(t, torch.Tensor) and t.numel() == N
    }


class TrafficCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema.arguments
        written = [
            value
            for value, arg in zip(args, schema, strict=False)
            if arg.alias_info is not None and arg.alias_info.is_write and arg.name != "grads"
        ]
        writes = _sized(written) if written else _sized(out)
        self.bytes += sum(_sized((args, kwargs)).values()) + sum(writes.values())
        return out


@pytest.mark.parametrize("impl", OPTIMIZER_IMPLS)
@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd-momentum", "sgd"])
def test_optimizer_traffic_matches_torch_ops(optimizer, impl):
    train = TrainSpec(precision="fp32", optimizer=optimizer, optimizer_impl=impl)
    param = torch.nn.Parameter(torch.randn(N))
    opt = make_optimizer([param], train)
    for _ in range(2):  # the first step creates the state
        param.grad = torch.randn(N)
        opt.step()
    param.grad = torch.randn(N)
    with TrafficCounter() as counter:
        opt.step()
    assert counter.bytes == optimizer_traffic(optimizer, impl, "fp32") * N
