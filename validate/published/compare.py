"""Predict every published run and compare with what it measured.

One row per (run, quantity): ``tokens_per_s_per_gpu`` (every run) and
``memory_bytes_per_gpu`` (runs that report memory; torchtitan reports the allocator's max
reserved bytes, predicted as the peak of allocated bytes times the profile's
``reserved_over_allocated``). Rows carry the prediction's breakdown, so the worst runs can
be read without re-running anything. Torch-free.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from costmodel import SpecError, estimate
from validate.published.corpus import Case, CorpusError, case_of, run_label
from validate.report.results import rel_err

BREAKDOWN = (
    "time_s.forward",
    "time_s.backward",
    "time_s.bubble",
    "time_s.optimizer",
    "time_s.compute",
    "time_s.comm",
    "time_s.step",
    "mfu",
    "memory_bytes_per_device.params",
    "memory_bytes_per_device.master",
    "memory_bytes_per_device.grads",
    "memory_bytes_per_device.optimizer",
    "memory_bytes_per_device.activations",
    "memory_bytes_per_device.peak",
)


def predict(case: Case) -> dict[str, Any]:
    """Predicted per-GPU throughput and memory of one case, with the breakdown."""
    est = estimate(case.model, case.train, case.parallel, case.hardware)
    out = {
        "tokens_per_s_per_gpu": est["tokens_per_s"] / case.n_gpus,
        "memory_bytes_per_gpu": est["memory_bytes_per_device.reserved"],
    }
    return {**out, "breakdown": {k: est[k] for k in BREAKDOWN if k in est.values}}


def rows_for(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one run: one per measured quantity, or one error row saying which
    field stops it (a run's field for the mapping, a spec field for the estimate)."""
    rid, group = run_label(run)
    base = {"case": rid, "group": group}
    try:
        case = case_of(run)
        pred = predict(case)
    except (CorpusError, SpecError, ValueError, KeyError) as err:
        return [{**base, "quantity": None, "status": "error", "error": _why(rid, err)}]
    rows = []
    for quantity, measured in case.measured.items():
        rows.append(
            {
                **base,
                "quantity": quantity,
                "predicted": pred[quantity],
                "measured": measured,
                "rel_err": rel_err(pred[quantity], measured),
                "status": "ok",
                "device": case.hardware.name,
                "n_gpus": case.n_gpus,
                "layout": _layout_text(case),
                "assumptions": list(case.assumptions),
                "breakdown": pred["breakdown"],
            }
        )
    return rows


def _why(rid: str, err: Exception) -> str:
    """One line naming the run and the field (the mapping's CorpusError already does)."""
    if isinstance(err, CorpusError):
        return str(err)
    if isinstance(err, SpecError):
        return f"{rid}: {err.field}: {err.message}"
    return f"{rid}: {err}"


def _layout_text(case: Case) -> str:
    p, t = case.parallel, case.train
    degrees = " ".join(f"{k}{getattr(p, k)}" for k in ("dp", "fsdp", "tp", "pp", "cp"))
    extra = f" v{p.pp_interleave}" if p.pp_interleave > 1 else ""
    extra += f" ep{p.ep}" if p.ep > 1 else ""
    return (
        f"{degrees}{extra} mb{t.micro_batch // p.batch_step(1)} ga{t.grad_accum} "
        f"T{t.seq} {t.precision} rc:{t.recompute} {t.attention}"
    )


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (quantity, source) and per quantity over all sources (``group`` "all",
    ``overall`` true): n, median and p90 |error|, bias (median signed error), worst |error|."""
    groups: dict[tuple[str, str, bool], list[float]] = defaultdict(list)
    for r in rows:
        if r["status"] == "ok" and r["rel_err"] is not None:
            groups[(r["quantity"], r["group"], False)].append(r["rel_err"])
            groups[(r["quantity"], "all", True)].append(r["rel_err"])
    out = []
    for (quantity, group, overall), errs in sorted(groups.items()):
        mags = sorted(abs(e) for e in errs)
        out.append(
            {
                "quantity": quantity,
                "group": group,
                "overall": overall,
                "n": len(errs),
                "median_abs": statistics.median(mags),
                "p90_abs": mags[min(len(mags) - 1, round(0.9 * (len(mags) - 1)))],
                "bias": statistics.median(errs),
                "worst_abs": mags[-1],
            }
        )
    return out
