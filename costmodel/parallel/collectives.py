"""The α-β cost of ring collectives on n ranks (pure; seconds, bytes).

A ring collective runs ``steps`` rounds, each paying the latency α and moving
``bytes_per_rank`` over each rank's link of bandwidth β: T = steps·α + bytes_per_rank/β
(Thakur, Rabenseifner & Gropp 2005, Sec. 4; Scaling Book ch. 3: an all-reduce costs an
all-gather plus a reduce-scatter). Sizes are the full tensor (all-gather: the output;
reduce-scatter and all-reduce: the input; broadcast: the buffer). Bus bandwidth is the
algorithm bandwidth times the bytes a rank must move per byte of tensor (NCCL tests'
convention), so it is comparable across collectives and rank counts.
"""

from __future__ import annotations

from typing import Any

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _check(op: str, n: Any) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)} (got {op!r})")
    if isinstance(n, int) and n < 2:  # a sympy symbol (the cost model's degrees) is not checked
        raise ValueError(f"ranks must be >= 2 (got {n})")


def ring_steps(op: str, n: Any) -> Any:
    """Rounds of a ring (pipelined chain for broadcast); ``n`` an int or a sympy degree."""
    _check(op, n)
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def bus_factor(op: str, n: Any) -> Any:
    """Bytes each rank moves per byte of the tensor; ``n`` an int or a sympy degree."""
    _check(op, n)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    return 1.0 if op == "broadcast" else (n - 1) / n


def bytes_per_rank(op: str, size_bytes: float, n: int) -> float:
    return bus_factor(op, n) * size_bytes


def collective_time(op: str, size_bytes: float, n: int, alpha_s: float, beta_bps: float) -> float:
    """Seconds: ring rounds times α plus the bytes each rank moves over β."""
    return ring_steps(op, n) * alpha_s + bytes_per_rank(op, size_bytes, n) / beta_bps
