"""Which collectives the compute waits for, and how much of them: the groups a step
exposes and the share of each that no overlap hides. Shared by step time
(``costmodel.parallel.timing``) and the timeline (``costmodel.engine.timeline``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from costmodel.parallel.pipeline import bidirectional, combined_alone
from costmodel.specs.frameworks import traits_of
from costmodel.specs.parallel import ParallelSpec
from costmodel.symbols.core import Y
from costmodel.symbols.ops import integer

if TYPE_CHECKING:  # sympy: only where a formula is asked for
    import sympy as sp


def exposed_groups(par: ParallelSpec) -> tuple[str, ...]:
    """Groups whose collectives the compute waits for: TP's feed the next matmul (async
    TP hides all but a 1/tp share, :func:`exposed_share`), the experts wait for their
    tokens' all-to-all (combined 1F1B hides most, :func:`exposed_share`), the hand-written
    FSDP gathers and reduces in line with nothing prefetched."""
    exposed = ("tp", "ep")
    return (*exposed, "fsdp") if traits_of(par).exposes_fsdp else exposed


def exposed_share(group: str, par: ParallelSpec) -> sp.Expr:
    """The share of an exposed group's collectives the compute waits for: all of them, but

    - under async TP a tensor-parallel collective is cut into tp chunks that each overlap
      the matmul of the chunk before (Wang et al. 2022, "Overlap Communication with
      Dependent Computation via Decomposition"; Transformer Engine's userbuffer ring
      exchange; torchtitan's async TP), so the first chunk's 1/tp stays exposed;
    - under combined 1F1B (``ep_overlap``) one micro-batch's all-to-alls run beside another
      micro-batch's compute, but for the passes that run alone
      (:func:`costmodel.parallel.pipeline.combined_alone`); the rest is overlapped like
      the other groups' collectives; DualPipe pairs forwards with backwards likewise (its
      F&B chunks, DeepSeek-V3 report Sec. 3.2.1; DualPipeV's too), whatever ``ep_overlap``
      says.
    """
    if group == "tp" and par.async_tp:
        return 1 / Y
    if group == "ep" and (par.ep_overlap or bidirectional(par)):
        return combined_alone(par)
    return integer(1)
