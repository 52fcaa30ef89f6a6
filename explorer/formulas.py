"""The Formulas tab: each headline quantity as named terms, and a legend of the symbols.

A step time or a peak is a long expression; shown whole it is unreadable. The tab shows
the terms it is built from (memory by component, time by phase), each with its value and
its expression (the long ones on request), and one table of every symbol they use with its
meaning and its value for the current inputs (``costmodel.symbols.DESCRIPTIONS``).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from costmodel.engine.diskcache import json_cached
from costmodel.engine.estimate import symbol_values
from costmodel.engine.quantities import EVAL_SYMBOLS, expressions, structure_of
from costmodel.inputs import Setup
from costmodel.symbols.algebra import Var
from costmodel.symbols.core import DESCRIPTIONS
from costmodel.units import fmt_quantity

_MEM = "memory_bytes_per_device."
_PARTS = ("frozen", "params", "master", "grads", "optimizer", "buffers", "activations",
          "peak_forward", "peak")  # fmt: skip
_PHASES = ("compute_forward", "compute_backward", "comm", "bubble", "optimizer", "step")
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Parameters", ("params.total", "params.trainable")),
    ("FLOPs per step", ("flops.forward", "flops.backward", "flops.step")),
    ("Memory per device: components, then the peaks", tuple(_MEM + p for p in _PARTS)),
    ("Step time: phases, then the step", tuple(f"time_s.{p}" for p in _PHASES)),
    ("Utilisation", ("mfu",)),
)
LONG = 100
"""An expression of more nodes than this (operations, symbols and numbers; about 4
characters of LaTeX each) is rendered only when asked for (:func:`_long_formula`)."""


SHOWN = tuple(key for _, keys in GROUPS for key in keys)
_BY_NAME = {s.name: s for s in EVAL_SYMBOLS}


@st.cache_data(show_spinner=False, max_entries=1024)
def _latex(structure: tuple, key: str) -> str:
    """LaTeX of one quantity; expressions depend only on the structure, so cached by it."""
    import sympy as sp

    comp = expressions(structure)
    return sp.latex(comp.exprs[comp.keys.index(key)])


def formula_rows(structure: tuple) -> dict[str, dict[str, Any]]:
    """Per shown quantity the structure has: its expression's size in nodes (cheaper to
    count than to print), its LaTeX when short (``LONG``) and the names of its symbols.
    Kept on disk (``diskcache.json_cached``): a structure met before, in any process, costs
    no sympy, where building its expressions takes ~1 s under tp x pp."""

    def build() -> dict[str, dict[str, Any]]:
        import sympy as sp

        comp = expressions(structure)
        rows = {}
        for key in (k for k in SHOWN if k in comp.keys):
            expr = comp.exprs[comp.keys.index(key)]
            size = sum(1 for _ in sp.preorder_traversal(expr))
            rows[key] = {"size": size, "latex": sp.latex(expr) if size <= LONG else None,
                         "symbols": sorted(s.name for s in expr.free_symbols)}  # fmt: skip
        return rows

    return json_cached(("formulas", structure, SHOWN, LONG), build)


summary = st.cache_data(show_spinner=False, max_entries=256)(formula_rows)


def legend(setup: Setup, symbols: list[Var]) -> list[dict[str, str]]:
    """symbol (LaTeX source), meaning and value for the current inputs, one row each."""
    import sympy as sp

    values = symbol_values(setup.model, setup.train, setup.parallel, setup.hardware)
    return [
        {"symbol": sp.latex(s.sym), "meaning": DESCRIPTIONS.get(s, "–"),
         "value": f"{values[s]:,.6g}" if s in values else "–"}
        for s in symbols
    ]  # fmt: skip


def formulas_tab(setup: Setup, v: dict[str, float]) -> None:
    """The formulas behind the numbers, on request: the numbers never build an expression,
    and sympy builds a structure's the first time they are shown (about a second; then
    from the disk cache, ``formula_rows``)."""
    st.caption(
        "Each quantity by the name `estimate --json`, `--formula` and the Python API "
        "use, its value here, then its formula in the symbols listed below."
    )
    if not st.toggle("show the formulas (sympy builds them the first time: about a second)",
                     key="show_formulas"):  # fmt: skip
        return
    structure = structure_of(setup.model, setup.train, setup.parallel)
    rows = summary(structure)
    used: set[str] = set()
    for title, keys in GROUPS:
        st.subheader(title)
        for key in (k for k in keys if k in v and k in rows):
            row = rows[key]
            used.update(row["symbols"])
            st.markdown(f"**{key}** = {fmt_quantity(key, v[key])}")
            if row["latex"] is not None:
                st.latex(row["latex"])
            else:
                _long_formula(structure, key, row["size"])
    st.subheader("Symbols")
    st.dataframe(legend(setup, [_BY_NAME[n] for n in sorted(used)]), hide_index=True)


@st.fragment
def _long_formula(structure: tuple, key: str, size: int) -> None:
    """A long expression behind a toggle that reruns only itself. KaTeX lays out every
    symbol as HTML elements of its own (a step time under tp x pp: some 250,000), which
    costs the browser seconds on every rerun, wanted or not (an expander lays out its
    content while closed), so it is printed and rendered only when asked for."""
    if st.toggle(f"show the expression ({size:,} terms, symbols and numbers)",
                 key=f"formula_{key}"):  # fmt: skip
        st.latex(_latex(structure, key))
