"""The device counts and batches a plan searches, and the candidate layouts of a cluster
as flat columns.

``PlanOptions`` (``costmodel.engine.options``) lists what the search may vary: every
framework the user allows with its sharding (FSDP2: fsdp shards x dp replicas; Megatron:
data parallel with the distributed optimizer; DeepSpeed and the reference model: ZeRO
1/2/3 over all replicas), tensor parallelism within a node (with and without sequence
parallelism), pipeline parallelism (plain and interleaved 1F1B, uneven stages included),
context parallelism, expert parallelism, the micro-batch per device and the recompute
policy. ``costmodel.engine.grid`` enumerates them, factored; the spec layer's own rules
(``config.check`` inside ``checks.collect_masks``) mask the invalid ones.
``costmodel.engine.plan`` evaluates and ranks what is left.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from costmodel.config import check
from costmodel.engine.grid import candidates, layout_grid
from costmodel.engine.options import PlanOptions
from costmodel.specs import checks
from costmodel.specs.checks import SpecError
from costmodel.specs.hardware import Hardware
from costmodel.specs.model import ModelSpec, TrainSpec

MAX_GPUS = 2**18
"""The largest ``max_gpus`` searched (262,144): above the largest clusters built, and a
search of every count up to it stays under a minute on two cores."""


def device_counts(max_gpus: int, per_node: int) -> list[int]:
    """The device counts a budget of ``max_gpus`` searches: every count up to one node, then
    whole nodes whose count has no prime factor above 5 (64, 72, 75, 80, ... nodes), the
    counts a layout of small-prime degrees fills; a prime node count such as 641 (5,128
    GPUs) would leave its layouts a pipeline of 641 stages or nothing. Bounded: 12,500
    nodes give 191 counts."""
    checks.integer("max_gpus", max_gpus)
    checks.at_most("max_gpus", max_gpus, f"{MAX_GPUS:,}", MAX_GPUS,
                   "(the largest training clusters hold 100,000 to 200,000 GPUs)")  # fmt: skip
    if max_gpus <= per_node:
        return list(range(1, max_gpus + 1))
    nodes = [n for n in range(1, max_gpus // per_node + 1) if _smooth(n)]
    return sorted({*range(1, per_node), *(per_node * n for n in nodes)})


def token_batches(
    low: int, high: int, seq: int, name: str = "global_batch_tokens"
) -> tuple[int, int]:
    """(low, high) sequences per optimizer step of a batch given in tokens, ``low`` to
    ``high`` (the CLI's ``--global-batch-tokens``, the API's ``batch_tokens``): one value must
    be whole sequences of ``seq`` tokens (the nearest two said otherwise); a range keeps the
    whole sequences inside it. ``name``: the field an error names."""
    checks.integer(name, low)
    checks.integer(name, high)
    if low == high and low % seq:
        down, up = low // seq * seq, -(-low // seq) * seq
        near = f"{down:,} or {up:,}" if down else f"{up:,}, one sequence"
        raise SpecError(name, f"{name} must be a multiple of seq "
                        f"({seq:,}): {low:,} is not (nearest: {near})")  # fmt: skip
    first, last = -(-low // seq), high // seq
    if first > last or last < 1:
        raise SpecError(name, f"{name} range {low:,}:{high:,} "
                        f"holds no whole number of {seq:,}-token sequences")  # fmt: skip
    return first, last


def batch_choices(low: int, high: int, keep: int = 8, counts: Iterable[int] = ()) -> list[int]:
    """The global batches a range searches: the ``keep`` largest in [low, high] with no
    prime factor above 7 (batches are chosen to split evenly: 2,520 = 2^3 3^2 5 7),
    ``high`` itself, and for each prime factor above 7 of a device count in ``counts`` its
    largest multiple in the range (5,128 GPUs = 8 x 641 place data-parallel ranks only in
    multiples of 641: 1,923 of a batch up to 2,520, Calculon's answer). A SpecError naming
    ``global_batch`` for an empty or reversed range."""
    checks.integer("global_batch", low)
    checks.integer("global_batch", high)
    if low > high:
        raise SpecError("global_batch", f"global_batch range {low}:{high} has min > max")
    found, b = [], high
    while b >= low and len(found) < keep:
        if b == high or _smooth(b, (2, 3, 5, 7)):
            found.append(b)
        b -= 1
    for p in sorted({p for c in counts for p in _large_primes(c)}):
        if high // p * p >= low:
            found.append(high // p * p)
    return sorted(set(found))


def _large_primes(n: int) -> list[int]:
    """The prime factors of ``n`` above 7."""
    out, d = [], 2
    while d * d <= n:
        while n % d == 0:
            out.append(d)
            n //= d
        d += 1
    return [p for p in (*out, *([n] if n > 1 else [])) if p > 7]


def _smooth(n: int, primes: tuple[int, ...] = (2, 3, 5)) -> bool:
    for p in primes:
        while n % p == 0:
            n //= p
    return n == 1


def enumerate_layouts(
    model: ModelSpec, train: TrainSpec, hardware: Hardware, gpus: int, options: PlanOptions
) -> dict[str, np.ndarray]:
    """Every candidate of ``gpus`` devices at ``train.batch`` (before the rules), as
    columns (``costmodel.engine.grid``; the planner checks the factored grid instead)."""
    grid = layout_grid(model, train, hardware, gpus, options)
    return grid.rows(grid.allowed)


def valid_mask(cols: dict[str, np.ndarray], model: ModelSpec, train: TrainSpec) -> np.ndarray:
    """The candidates every rule accepts (``costmodel.config.check``, as for one input)."""
    par, per_candidate = candidates(cols, train)
    with checks.collect_masks() as masks:
        check(model, per_candidate, par)
    return checks.passing(masks, len(cols["tp"]))


def no_layout_message(
    cols: dict[str, np.ndarray], model: ModelSpec, train: TrainSpec, gpus: int,
    micro_batches: tuple[int, ...] | None = None,
) -> str:  # fmt: skip
    """Why nothing is valid: the rule the simplest candidate breaks, in its own words; a
    batch no replica of the asked micro-batch sizes can split, with the replicas' batches."""
    if not len(cols["tp"]):
        degrees = [d for d in range(1, gpus + 1) if gpus % d == 0 and train.batch % d == 0]
        if micro_batches and degrees:
            shares = ", ".join(f"{train.batch // d:,}" for d in reversed(degrees))
            sizes = ", ".join(map(str, micro_batches))
            return (f"gpus {gpus}: no layout splits batch {train.batch} into micro_batches "
                    f"of {sizes}: a replica's batch (the global batch over a data-parallel "
                    f"degree: {shares}) must be a multiple of one")  # fmt: skip
        return (f"gpus {gpus}: no layout splits batch {train.batch}: the global batch must "
                "be a multiple of the data-parallel degree of some layout")  # fmt: skip
    first = {k: v[:1] for k, v in cols.items()}
    try:
        par, per_candidate = candidates(first, train)
        check(model, per_candidate, par)
    except SpecError as err:
        thin = _thin(gpus, train)
        return f"gpus {gpus}: no valid layout for this model and batch (e.g. {err}){thin}"
    return f"gpus {gpus}: no valid layout for this model and batch{_thin(gpus, train)}"


def _thin(gpus: int, train: TrainSpec) -> str:
    """Where the devices outnumber the sequences: what that asks of each sequence."""
    if gpus <= train.batch:
        return ""
    return (
        f"; {gpus:,} GPUs over a batch of {train.batch:,} sequences split each over "
        f"{-(-gpus // train.batch):,} devices or more (tp x pp x cp): a larger batch or "
        "fewer GPUs"
    )
