"""Eager elementwise traffic: the closed form equals the bytes torch dispatches.

``validate.probes.traffic`` counts the tensor bytes every elementwise op reads and writes
in a forward and backward of the reference model (meta device, full width, one and two
layers at two sequence lengths); ``costmodel.single.elementwise.eager_bytes`` must equal
the per-token, per-layer figure exactly, for every preset and precision.
"""

from __future__ import annotations

import pytest

from costmodel import PRESETS, get_model
from costmodel.kinds import ffn
from costmodel.single.elementwise import eager_bytes
from costmodel.single.precision import PRECISIONS
from costmodel.symbols import D, F, values_for
from costmodel.symbols.algebra import by_symbol
from validate.probes.traffic import eager_traffic

EAGER = [name for name in PRESETS if not get_model(name).mla]
"""MLA's eager traffic is not modelled (``elementwise=eager`` is refused for it)."""


@pytest.mark.parametrize("name", EAGER)
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
def test_eager_bytes_equal_the_dispatched_bytes(name, precision):
    """An MoE preset's blocks all as MoE blocks (its dense leading ones are a dense
    model's): the meta device routes them balanced (validate/reference/moe.py)."""
    model, prec = get_model(name), PRECISIONS[precision]
    if model.moe:
        model = model.replace(dense_layers=0)
    sizes = values_for(model)
    block = ffn.top(model).name
    predicted = [e.xreplace(by_symbol(sizes)) for e in
                 eager_bytes(model, prec.residual, prec.activation, block=block)]  # fmt: skip
    measured = eager_traffic(model, precision)
    assert predicted == [int(m) for m in measured]
    assert all(m == int(m) for m in measured)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
def test_dropout_bytes_equal_the_dispatched_bytes(precision):
    """Branch dropout (native_dropout and its backward), on the FFN-only XXL: the CPU flash
    kernel has no attention dropout, and the naive core's ops belong to its own roofline."""
    model, prec = get_model("xxl"), PRECISIONS[precision]
    sizes = {D: model.d_model, F: model.d_ff}
    predicted = eager_bytes(model, prec.residual, prec.activation, dropout=True)
    measured = eager_traffic(model, precision, dropout=0.1)
    assert [e.xreplace(by_symbol(sizes)) for e in predicted] == [int(m) for m in measured]
    assert predicted != eager_bytes(model, prec.residual, prec.activation)
