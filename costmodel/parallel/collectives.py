"""The α-β cost of ring collectives on n ranks (pure; seconds, bytes).

A ring collective runs ``steps`` rounds, each paying the latency α and moving
``bytes_per_rank`` over each rank's link of bandwidth β: T = steps·α + bytes_per_rank/β
(Thakur, Rabenseifner & Gropp 2005, Sec. 4; Scaling Book ch. 3: an all-reduce costs an
all-gather plus a reduce-scatter). An all-to-all sends each of the other n - 1 ranks
its 1/n of the buffer in n - 1 pairwise rounds (NCCL's, and MPI's pairwise exchange;
Thakur et al. 2005, Sec. 3.4). Sizes are the full tensor (all-gather: the output;
reduce-scatter and all-reduce: the input; all-to-all: one rank's input; broadcast: the
buffer). Bus bandwidth is the
algorithm bandwidth times the bytes a rank must move per byte of tensor (NCCL tests'
convention), so it is comparable across collectives and rank counts.
"""

from __future__ import annotations

from typing import Any

from costmodel.symbols.algebra import symbolic
from costmodel.symbols.core import smin
from costmodel.symbols.ops import log, sceil

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def _check(op: str, n: Any) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)} (got {op!r})")
    # a degree of the cost model's formulas (a symbol, or its value, 1 included, where
    # they compute numbers) is not checked
    if isinstance(n, int) and n < 2 and symbolic():
        raise ValueError(f"ranks must be >= 2 (got {n})")


def ring_steps(op: str, n: Any) -> Any:
    """Rounds of a ring (pipelined chain for broadcast); ``n`` an int or a sympy degree."""
    _check(op, n)
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def tree_steps(n: Any) -> Any:
    """Latency rounds of NCCL's double-binary-tree all-reduce on n ranks: a reduce up and a
    broadcast down a tree of depth ceil(log2 n), pipelined so that it still moves the ring's
    2(n-1)/n bytes per rank (Sanders, Speck & Träff 2009, two-tree broadcast and reduction;
    Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA 2019: full
    bandwidth at logarithmic latency). ``n`` an int or a sympy degree."""
    return 2 * sceil(log(n) / log(2))


def allreduce_steps(n: Any) -> Any:
    """Latency rounds of an all-reduce as NCCL runs it across nodes: its tuner picks the
    ring or the tree, whichever is faster; at equal bandwidth that is the fewer rounds."""
    return smin(ring_steps("all_reduce", n), tree_steps(n))


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


def bucket_indices(sizes: list[int], bucket_size_mb: float) -> list[list[int]]:
    """Buckets of positions into ``reversed(sizes)`` (backward's order): consecutive
    gradients until the next would pass ``bucket_size_mb`` MiB; a larger one is alone.
    torch DDP's rule (Li et al. 2020, "PyTorch Distributed", Sec. 3.2.3: buckets in reverse
    parameter order, the order gradients become ready)."""
    limit, buckets, size = bucket_size_mb * 2**20, [], 0
    for i, nbytes in enumerate(reversed(sizes)):
        if not buckets or (size + nbytes > limit and buckets[-1]):
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


DDP_VARIANTS = ("naive", "flat", "overlap", "bucketed")


def ddp_allreduce_time(
    variant: str,
    grad_sizes: list[int],
    n: int,
    alpha_s: float,
    beta_bps: float,
    bucket_mb: float = 25.0,
) -> float:
    """α-β seconds of the gradient all-reduces a DDP variant issues on n ranks: one per
    gradient (``naive``, ``overlap``), one of everything (``flat``) or one per bucket
    (``bucketed``, :func:`bucket_indices`). ``grad_sizes`` in bytes, parameter order."""
    if variant not in DDP_VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(DDP_VARIANTS)} (got {variant!r})")
    if variant in ("naive", "overlap"):
        sizes = list(grad_sizes)
    elif variant == "flat":
        sizes = [sum(grad_sizes)]
    else:
        order = list(reversed(grad_sizes))
        sizes = [sum(order[i] for i in b) for b in bucket_indices(grad_sizes, bucket_mb)]
    return sum(collective_time("all_reduce", s, n, alpha_s, beta_bps) for s in sizes)
