"""Fits of the calibration's measurements to costmodel's own cost forms.

- Links: T = steps·α + bytes_per_rank/β, the α-β form of
  :mod:`costmodel.parallel.collectives` (Thakur, Rabenseifner & Gropp 2005), over every
  collective and message size of one kind of placement at once, since costmodel gives a
  link one α and one β. Rounds: the ring's, but an all-reduce's as costmodel counts a
  data-parallel one (the fewer of the ring's and the double binary tree's), and one for a
  send/recv, whose rank moves the whole message.
- GEMMs: a shape's seconds are max(2·k·t_m·t_n·tiles / C_eff, bytes / W_hbm), the tile and
  wave quantization of :mod:`costmodel.parallel.gemms` (NVIDIA's "Matrix Multiplication
  Background User's Guide"), with tiles of 1 x 1 where the device has no SM count (CPUs).
  The fit is the C_eff that minimises the squared log error over all shapes: one number
  whose curve over shapes is the model's, reported beside what each shape measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from costmodel.parallel.collectives import allreduce_steps, bus_factor, ring_steps
from validate.distributed.collectives import solve_alpha_beta


def rounds(op: str, n: int) -> float:
    """Latency rounds of ``op`` on ``n`` ranks (module docstring)."""
    if op == "send_recv":
        return 1.0
    return float(allreduce_steps(n)) if op == "all_reduce" else float(ring_steps(op, n))


def moved(op: str, size: int, n: int) -> float:
    """Bytes one rank sends for a tensor of ``size`` bytes."""
    return float(size) if op == "send_recv" else float(bus_factor(op, n)) * size


def alpha_beta(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """α (s), β (B/s) and the fit's rms relative error over ``rows`` (``op``, ``n``,
    ``size_bytes``, ``seconds``), least squares in relative error (every size counts the
    same); α pinned at 0 where the free fit makes it negative."""
    if not rows:
        raise ValueError("no measurements to fit")
    a = np.array([[rounds(r["op"], r["n"]), moved(r["op"], r["size_bytes"], r["n"])]
                  for r in rows])  # fmt: skip
    t = np.array([r["seconds"] for r in rows], dtype=float)
    alpha, beta = solve_alpha_beta(a[:, 0], a[:, 1], t)
    rms = float(np.sqrt(np.mean(((a @ np.array([alpha, 1 / beta])) / t - 1) ** 2)))
    return {"alpha_s": alpha, "beta_Bps": beta, "rms_rel_err": rms}


def tile_flops(n: int, k: int, n2: int, tiling: tuple[int, int, int]) -> float:
    """FLOPs the device's tiles run for an (n x k)(k x n2) GEMM: 2·k·t_m·t_n per tile-time
    (``costmodel.parallel.gemms.tile_slots``, evaluated)."""
    sms, tm, tn = tiling
    tiles = math.ceil(n / tm) * math.ceil(n2 / tn)
    slices = max(1, sms // max(tiles, 1))
    slots = math.ceil(tiles * slices / sms) * sms / slices
    return 2.0 * k * tm * tn * slots


def gemm_rate(
    rows: Sequence[dict[str, Any]], tiling: tuple[int, int, int], hbm_bps: float, nbytes: int
) -> dict[str, Any]:
    """The C_eff (FLOP/s) whose roofline-with-tiles curve best fits the measured GEMMs
    (``n``, ``k``, ``n2``, ``seconds``), and each shape's predicted seconds and error."""
    if not rows:
        raise ValueError("no GEMM measurements to fit")
    work = np.array([tile_flops(r["n"], r["k"], r["n2"], tiling) for r in rows])
    traffic = (
        np.array([nbytes * (r["n"] * r["k"] + r["k"] * r["n2"] + r["n"] * r["n2"]) for r in rows])
        / hbm_bps
    )
    t = np.array([r["seconds"] for r in rows], dtype=float)
    implied = work / t
    candidates = np.geomspace(implied.min() / 2, implied.max() * 2, 2001)
    pred = np.maximum(work[None, :] / candidates[:, None], traffic[None, :])
    loss = (np.log(pred / t[None, :]) ** 2).sum(axis=1)
    best = int(np.argmin(loss))
    shapes = [
        {
            **{q: r[q] for q in ("n", "k", "n2", "seconds")},
            "predicted_s": float(p),
            "rel_err": float(p / r["seconds"] - 1),
        }
        for r, p in zip(rows, pred[best], strict=True)
    ]
    errors = [abs(s["rel_err"]) for s in shapes]
    return {
        "flops": float(candidates[best]),
        "median_abs_err": float(np.median(errors)),
        "worst_abs_err": float(max(errors)),
        "shapes": shapes,
    }


def hidden_share(compute_s: float, comm_s: float, both_s: float) -> float:
    """The share of the shorter of a compute and a collective that ran beside the other when
    both were issued together: (compute + comm - both) / min(compute, comm), in [0, 1]."""
    shorter = min(compute_s, comm_s)
    if shorter <= 0:
        return 1.0
    return float(min(1.0, max(0.0, (compute_s + comm_s - both_s) / shorter)))
