"""Rows of predicted vs measured values, appended to JSONL as soon as they exist.

An output directory holds ``results.jsonl`` (one row per measurement) and ``cases.jsonl``
(one line per finished case). Each line is flushed and fsynced when written, so an
interrupt or a crash loses at most the case in flight; ``resume`` drops that case's
partial rows and skips every finished case.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATUSES = ("ok", "oom", "error", "skipped")
REQUIRED = ("suite", "case", "quantity", "predicted", "measured", "rel_err", "device", "status")


def rel_err(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured; None where either is missing or measured is 0."""
    if predicted is None or measured is None:
        return 0.0 if predicted == measured == 0 else None
    if measured == 0:
        return 0.0 if predicted == 0 else None
    return (float(predicted) - float(measured)) / abs(float(measured))


def _plain(value: Any) -> Any:
    """JSON-safe: exact ints stay ints, floats that are not finite become None."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalars
        return _plain(value.item())
    return str(value)


@dataclass(frozen=True)
class Row:
    suite: str
    case: str
    quantity: str
    predicted: float | None
    measured: float | None
    device: str
    status: str = "ok"
    unit: str = ""
    extra: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)} (got {self.status!r})")

    def to_dict(self) -> dict[str, Any]:
        out = {
            "suite": self.suite,
            "case": self.case,
            "quantity": self.quantity,
            "unit": self.unit,
            "predicted": self.predicted,
            "measured": self.measured,
            "rel_err": rel_err(self.predicted, self.measured),
            "device": self.device,
            "status": self.status,
        }
        return _plain({**out, **(self.extra or {})})


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Lines of a JSONL file; a torn last line (killed mid-write) is ignored."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_rows(out_dir: str | Path) -> list[dict[str, Any]]:
    return _read_jsonl(Path(out_dir) / "results.jsonl")


class ResultsLog:
    """Append-only results of one output directory, with resume."""

    def __init__(self, out_dir: str | Path, *, resume: bool = False) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results, self.cases = self.dir / "results.jsonl", self.dir / "cases.jsonl"
        if not resume and (self.results.exists() or self.cases.exists()):
            raise FileExistsError(
                f"--out {self.dir} already holds results: pass --resume to continue that run "
                "or choose another --out"
            )
        finished = _read_jsonl(self.cases)
        self.done: set[tuple[str, str]] = {(c["suite"], c["case"]) for c in finished}
        kept = [r for r in _read_jsonl(self.results) if (r["suite"], r["case"]) in self.done]
        self._rewrite(kept)

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.results.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, self.results)

    @staticmethod
    def _append(path: Path, record: dict[str, Any]) -> None:
        with path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def write(self, rows: Iterable[Row]) -> None:
        for row in rows:
            self._append(self.results, row.to_dict())

    def finish(self, suite: str, case: str, status: str, wall_s: float) -> None:
        self._append(self.cases, {"suite": suite, "case": case, "status": status, "wall_s": wall_s})
        self.done.add((suite, case))

    def is_done(self, suite: str, case: str) -> bool:
        return (suite, case) in self.done
