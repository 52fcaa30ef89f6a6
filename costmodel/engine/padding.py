"""What padding costs: wasted tokens, FLOPs and time of each way to batch variable-length
sequences (``python -m costmodel padding``).

Strategies, for a dataset of document lengths, rows of at most ``max_len`` tokens (longer
documents are truncated) and ``batch`` rows per step:

* ``pad-to-max``: every document padded to ``max_len``;
* ``pad-to-longest``: shuffled batches, each padded to its longest document (a dynamic
  collator, e.g. Hugging Face ``DataCollatorWithPadding``);
* ``bucketing``: Hugging Face Trainer's ``group_by_length``: shuffled mega-batches of 50
  batches, sorted by length, cut into batches, each padded to its longest;
* ``packing`` / ``packing-masked``: documents packed first-fit-decreasing into rows of
  ``max_len`` (none split), the row's tail padded; without a mask every token attends to
  the whole row (cross-document attention is wasted work), with a document mask (varlen /
  block-causal attention) each document attends only to itself.

A row of n tokens costs step FLOPs ``a·n + c·s`` where ``s`` is n² (or Σ l² under a
document mask): ``a`` and ``c`` are the coefficients of costmodel's step FLOPs per sequence
(:func:`costmodel.single.flops.flop_totals`, attention counted dense), and time ``α·n + γ·s``
is fitted to :func:`costmodel.engine.estimate.estimate`'s compute time at ``max_len`` and
``max_len / 2`` (the same per-op roofline, attention kernel rates included); each step adds
the estimate's optimizer and exposed-communication time. Useful work is Σ a·l + c·l² over
the documents alone.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from costmodel.single.flops import flop_totals
from costmodel.symbols.core import T, numeric, values_for

STRATEGIES = ("pad-to-max", "pad-to-longest", "bucketing", "packing", "packing-masked")
MEGABATCH = 50
"""Batches per sorted mega-batch (transformers ``LengthGroupedSampler``, mega_batch_mult)."""


@dataclass(frozen=True)
class RowCosts:
    """Per-token and per-token² coefficients: FLOPs (a, c) and seconds (alpha, gamma), the
    seconds each row costs whatever its length (kappa), and seconds added per step."""

    a: float
    c: float
    alpha: float
    gamma: float
    per_step_s: float = 0.0
    kappa: float = 0.0


def row_coefficients(setup: Any) -> RowCosts:
    """FLOP and time coefficients of one sequence from an ``inputs.Setup`` (with a layout
    for time; without one, time is 0). A row's seconds are kappa + alpha·n + gamma·n²,
    fitted through the estimate's compute at seq, seq/2 and seq/4: the estimate's part
    that does not grow with the tokens (kernel launches, GEMM tiles a short row leaves
    idle) is kappa's; without it a two-point fit put that part into a negative gamma and
    priced less attention (a document mask) slower (a probe). Where seq is too short for
    three distinct points, kappa is 0."""
    model, train = setup.model, setup.train
    one = values_for(model, train.replace(batch=1, grad_accum=1))  # one sequence

    def flops(n: int) -> Fraction:  # one sequence of n tokens' FLOPs, exactly
        with numeric({**one, T: n}):
            return Fraction(flop_totals(model, train)["step"])

    f1, f2, f3 = flops(1), flops(2), flops(3)  # quadratic in n: k + a n + c n^2
    c = (f3 - 2 * f2 + f1) / 2
    a, c = float(f2 - f1 - 3 * c), float(c)
    if setup.parallel is None:
        return RowCosts(a, c, 0.0, 0.0)
    unit = setup.parallel.seq_step()
    points = sorted({train.seq, *(unit * max(1, train.seq // d // unit) for d in (2, 4))})
    t1 = setup.estimate()
    per_seq = [(t1 if n == train.seq else replace(setup, train=train.replace(seq=n)).estimate())[
        "time_s.compute"] / train.batch for n in points]  # fmt: skip
    if len(points) == 3:
        kappa, alpha, gamma = np.linalg.solve([[1, n, n**2] for n in points], per_seq)
    else:
        (alpha, gamma), kappa = np.linalg.lstsq([[n, n**2] for n in points], per_seq)[0], 0.0
    return RowCosts(a, c, float(alpha), float(gamma), t1["time_s.step"] - t1["time_s.compute"],
                    float(kappa))  # fmt: skip


def _rows_padded(lengths: np.ndarray, batch: int, mega: int | None, seed: int) -> np.ndarray:
    """Row length of each document when batches are padded to their longest."""
    rng = np.random.default_rng(seed)
    order = lengths[rng.permutation(len(lengths))]
    if mega is not None:  # sort each mega-batch, longest first
        size = mega * batch
        order = np.concatenate([np.sort(order[i : i + size])[::-1]
                                for i in range(0, len(order), size)])  # fmt: skip
    starts = np.arange(0, len(order), batch)
    longest = np.maximum.reduceat(order, starts)
    return np.repeat(longest, np.diff(np.append(starts, len(order))))


def pack_rows(lengths: np.ndarray, max_len: int) -> list[list[int]]:
    """First-fit decreasing into rows of ``max_len`` (Johnson 1973: at most 11/9 OPT + 1
    rows); a row's free space is kept in a sorted list searched by bisection."""
    free: list[tuple[int, int]] = []  # (space left, row index), sorted
    rows: list[list[int]] = []
    for n in sorted(lengths.tolist(), reverse=True):
        i = bisect.bisect_left(free, (n, -1))
        if i == len(free):
            rows.append([n])
            bisect.insort(free, (max_len - n, len(rows) - 1))
            continue
        space, r = free.pop(i)
        rows[r].append(n)
        bisect.insort(free, (space - n, r))
    return rows


def packed_row_count(lengths: np.ndarray, max_len: int) -> int:
    """``len(pack_rows(lengths, max_len))`` in bulk: rows are counted by their space left.
    Best fit puts a document of n tokens in the row of least space s >= n, and the next of
    the same length in the same row while s - n >= n: a row of space s takes s // n of
    them, a new row max_len // n. So a run of equal lengths is placed a whole class of rows
    at a time, at most (distinct lengths + distinct spaces) steps of numpy for millions of
    documents, where one bisection per document took minutes."""
    lengths_, counts = np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)
    rows = np.zeros(max_len + 1, dtype=np.int64)  # rows by space left
    opened = 0
    for n, c in zip(lengths_[::-1].tolist(), counts[::-1].tolist(), strict=True):
        while c:
            fits = np.flatnonzero(rows[n:])
            if not len(fits):  # new rows of max_len // n documents each
                per = max_len // n
                full, rest = divmod(c, per)
                rows[max_len - per * n] += full
                rows[max_len - rest * n] += bool(rest)
                opened, c = opened + full + bool(rest), 0
                continue
            space = n + int(fits[0])
            per = space // n
            used = min(int(rows[space]), c // per)
            if used:  # whole rows of this space, filled to below n
                rows[space] -= used
                rows[space - per * n] += used
                c -= used * per
            else:  # fewer documents than one row takes: they all go to one
                rows[space] -= 1
                rows[space - c * n] += 1
                c = 0
    return opened


def strategy_costs(
    lengths: np.ndarray, max_len: int, batch: int, coef: RowCosts, *, seed: int = 0
) -> dict[str, dict[str, float]]:
    """Tokens, FLOPs and seconds of every strategy (see the module docstring)."""
    docs = np.minimum(lengths, max_len).astype(np.float64)
    useful = float(np.sum(coef.a * docs + coef.c * docs**2))
    real = float(docs.sum())
    out = {}
    for name in STRATEGIES:
        n_rows, slots, quad = _processed(name, docs, max_len, batch, seed)
        flops = coef.a * slots + coef.c * quad
        seconds = (
            coef.kappa * n_rows
            + coef.alpha * slots
            + coef.gamma * quad
            + np.ceil(n_rows / batch) * coef.per_step_s
        )
        out[name] = {
            "rows": n_rows, "slots": slots, "tokens": real, "pad_tokens": slots - real,
            "pad_fraction": 1 - real / slots, "flops": flops, "useful_flops": useful,
            "wasted_flops_fraction": 1 - useful / flops, "seconds": seconds,
            "tokens_per_s": real / seconds if seconds else float("nan"),
        }  # fmt: skip
    return out


def _processed(name: str, docs: np.ndarray, max_len: int, batch: int, seed: int) -> tuple:
    """(rows, token slots computed, Σ of the attention's n² terms) of one strategy."""
    if name == "pad-to-max":
        return len(docs), len(docs) * max_len, len(docs) * float(max_len) ** 2
    if name in ("pad-to-longest", "bucketing"):
        rows = _rows_padded(docs, batch, MEGABATCH if name == "bucketing" else None, seed)
        return len(rows), float(rows.sum()), float(np.sum(rows**2))
    packed = packed_row_count(docs.astype(np.int64), max_len)
    quad = float(np.sum(docs**2)) if name == "packing-masked" else packed * max_len**2
    return packed, float(packed * max_len), float(quad)


LONGEST_DRAWN = 2**24
"""The longest document a distribution draws (tokens); longer draws are held at it."""


def truncated(lengths: np.ndarray, seq: int) -> dict[str, Any]:
    """The documents longer than a row, which every strategy cuts at ``seq`` tokens, and
    the share of all tokens cut off (``padding`` and the Padding page say it)."""
    over = lengths > seq
    dropped = int((lengths[over] - seq).sum())
    return {"documents": int(over.sum()), "tokens": dropped,
            "tokens_fraction": dropped / float(lengths.sum())}  # fmt: skip


TIMED = ("seconds", "tokens_per_s", "train_days", "train_cost")
"""A strategy's numbers that are no answer when the layout does not fit."""


def judged(rows: dict[str, dict[str, Any]], setup: Any) -> Any:
    """The layout's fit verdict (``engine.fit.Fit``; None without a layout), with each
    strategy's time, speed, days and cost set to None where it does not fit (the CLI's and
    the app's rule: no speed for a layout that cannot run; the padding shares stand)."""
    if setup.parallel is None:
        return None
    fit = setup.estimate().fit()
    if not fit.fits:
        for row in rows.values():
            row.update({k: None for k in TIMED if k in row})
    return fit
