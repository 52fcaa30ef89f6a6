"""The attention pattern's rules: sliding-window (local) and global layers.

A local layer's query i sees the keys i - W < j <= i (Mistral 7B, Jiang et al. 2023,
Sec. 2, "Sliding Window Attention"); a per-layer pattern makes every ``global_every``-th
layer global, the rest local (Gemma 2, Gemma Team 2024, Sec. 2: local and global layers
alternate; Gemma 3, Gemma Team 2025, Sec. 2: five local layers to each global one). The
rules run on specs and on namespaces of numpy arrays alike (a sweep's group), as
``config.check`` calls them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.specs import checks


def is_local(layer: int, sliding_window: int, global_every: int) -> bool:
    """Whether block ``layer`` (0-based) has a sliding window: with a window, every block
    but each ``global_every``-th (1-based; none when 0)."""
    if sliding_window <= 0:
        return False
    return global_every == 0 or (layer + 1) % global_every != 0


def window_rules(model: Any, par: Any = None) -> None:
    """A pattern needs a window; a window needs attention; ring attention (cp > 1) passes
    whole K/V blocks around the ring, whose banded schedule is not modelled."""
    window = np.asarray(getattr(model, "sliding_window", 0))
    every = np.asarray(getattr(model, "global_every", 0))
    ok = (every == 0) | (window > 0)
    checks.require(ok, "global_every", lambda: "global_every needs sliding_window >= 1 (got "
                   f"global_every={checks._first_bad(ok, every)[0]} without a window; "
                   "set global_every 0)")  # fmt: skip
    ok = (window == 0) | ~np.asarray(model.ffn_only, dtype=bool)
    checks.require(ok, "sliding_window", lambda: "sliding_window needs attention "
                   "(ffn_only is set)")  # fmt: skip
    if par is None:
        return
    ok = (window == 0) | (np.asarray(par.cp) == 1)
    checks.require(ok, "cp", lambda: "cp > 1 (ring attention) with a sliding window is not "
                   f"modelled (got cp={checks._first_bad(ok, par.cp)[0]}, "
                   f"sliding_window={checks._first_bad(ok, window)[0]})")  # fmt: skip
