"""The Scaling Book's closed forms (``costmodel.book``): the formulas a notebook prints and
the numbers the CLI, the app and the API compute from the same definitions."""

from __future__ import annotations

import pytest

from costmodel import ParallelSpec, TrainSpec, get_model
from costmodel.book.bounds import bounds_report
from costmodel.book.fsdp import min_fsdp, min_fsdp_expr
from costmodel.catalog.hardware import get_hardware


def test_min_fsdp_formula_is_the_number_it_computes():
    """The closed form a notebook prints (sympy) and the number ``min_fsdp`` computes."""
    from costmodel.symbols import T, X, Y, b, values_for

    model, train = get_model("xxl"), TrainSpec(batch=1, seq=8192)
    exprs = min_fsdp_expr(model, train, 0.5)
    values = {**values_for(model, train), b: 1, T: 8192, X: 1, Y: 1, exprs["budget"]: 95e9}
    r = min_fsdp(model, train, 95e9, 8192, 0.5)
    assert float(exprs["n_at_budget"].xreplace(values)) == pytest.approx(r["fsdp_exact"])
    assert int(exprs["state"].xreplace(values)) == r["state_bytes"]


def test_the_numbers_without_sympy_are_the_solved_formulas():
    """``latex=False`` computes B* as c / (a - b) on numbers; sympy's solved B* (printed
    with ``latex=True``) at the same values is the same number, and so is every other
    field."""
    from costmodel.book.bounds import W_ici, W_tp, critical_batch
    from costmodel.symbols import M_X, M_Y, C, D, F, L, X, Y

    model, hw = get_model("llama3-70b"), get_hardware("h100-sxm")
    for fsdp, tp in ((8, 8), (64, 1), (16, 4)):
        par = ParallelSpec(fsdp=fsdp, tp=tp)
        fast = bounds_report(model, par, hw, latex=False)
        full = bounds_report(model, par, hw)
        assert {k: v for k, v in full.items() if k != "latex"} == fast
        values = {C: fast["peak_flops"], W_ici: fast["bandwidth"], W_tp: fast["tp_bandwidth"],
                  X: fsdp, Y: tp, M_X: 1, M_Y: 1, D: model.d_model, F: model.d_ff,
                  L: model.n_layers}  # fmt: skip
        solved = critical_batch(model, fsdp, tp, False).subs(values)
        assert float(solved) == pytest.approx(fast["critical_batch_tokens"], rel=1e-12)
