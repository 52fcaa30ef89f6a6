"""Rows of predicted vs measured values, appended to JSONL as soon as they exist.

An output directory holds ``results.jsonl`` (one row per measurement) and ``cases.jsonl``
(one line per finished case, with its row count). Each line is flushed and fsynced when
written, so an interrupt or a crash loses at most the case in flight; ``resume`` drops that
case's partial rows, reruns any finished case whose rows are not all readable, and skips
every other finished case. Readers skip (and count) lines that are torn or lack a field.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
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


def _parse_jsonl(path: Path) -> tuple[list[Any], int]:
    """The lines of a JSONL file that parse, and how many did not (a line torn by a kill
    mid-write, or two lines merged when an append followed a torn one)."""
    if not path.exists():
        return [], 0
    parsed, bad = [], 0
    for line in path.read_text().splitlines():
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    return parsed, bad


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def is_row(record: Any) -> bool:
    """Whether ``record`` is a row the report can use: every required key, a known status,
    numbers (or None) where numbers go."""
    return (
        isinstance(record, dict)
        and all(k in record for k in REQUIRED)
        and record["status"] in STATUSES
        and all(_is_number(record[k]) for k in ("predicted", "measured", "rel_err"))
    )


def load_rows(out_dir: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The usable rows of ``out_dir/results.jsonl`` and how many lines were skipped
    (unreadable, or missing fields), so a reader can say so rather than crash."""
    parsed, bad = _parse_jsonl(Path(out_dir) / "results.jsonl")
    rows = [r for r in parsed if is_row(r)]
    return rows, bad + len(parsed) - len(rows)


def read_rows(out_dir: str | Path) -> list[dict[str, Any]]:
    """The usable rows of ``out_dir/results.jsonl`` (see :func:`load_rows`)."""
    return load_rows(out_dir)[0]


def _finished(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The readable lines of ``cases.jsonl`` by (suite, case), the last line of a case winning."""
    lines = [
        c for c in _parse_jsonl(path)[0] if isinstance(c, dict) and "suite" in c and "case" in c
    ]
    return {(c["suite"], c["case"]): c for c in lines}


class ResultsLog:
    """Append-only results of one output directory, with resume.

    ``finish`` records how many rows a case wrote; on resume a finished case counts as done
    only when ``results.jsonl`` still holds exactly that many usable rows of it (a line
    without a count, written before counts were kept, is trusted), else it runs again.
    Resume rewrites both files without their torn lines, so the next append starts on a
    line of its own. ``results.jsonl`` is created by the first row, not by opening the log.
    """

    def __init__(self, out_dir: str | Path, *, resume: bool = False) -> None:
        self.dir = Path(out_dir)
        self.results, self.cases = self.dir / "results.jsonl", self.dir / "cases.jsonl"
        if not resume and (self.results.exists() or self.cases.exists()):
            raise FileExistsError(
                f"--out {self.dir} already holds results: pass --resume to continue that run "
                "or choose another --out"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.dir):  # unwritable: fail now, not after a case
            pass
        self.done: set[tuple[str, str]] = set()
        self._written: Counter[tuple[str, str]] = Counter()
        if resume:
            self._resume()

    def _resume(self) -> None:
        rows = read_rows(self.dir)
        counts = Counter((r["suite"], r["case"]) for r in rows)
        finished = {
            key: line
            for key, line in _finished(self.cases).items()
            if line.get("rows", counts[key]) == counts[key]
        }
        self.done = set(finished)
        kept = [r for r in rows if (r["suite"], r["case"]) in self.done]
        for path, records in ((self.results, kept), (self.cases, list(finished.values()))):
            if path.exists():
                _rewrite(path, records)

    def write(self, rows: Iterable[Row]) -> None:
        for row in rows:
            _append(self.results, row.to_dict())
            self._written[(row.suite, row.case)] += 1

    def finish(self, suite: str, case: str, status: str, wall_s: float) -> None:
        rows = self._written.pop((suite, case), 0)
        record = {"suite": suite, "case": case, "status": status, "wall_s": wall_s, "rows": rows}
        _append(self.cases, record)
        self.done.add((suite, case))

    def is_done(self, suite: str, case: str) -> bool:
        return (suite, case) in self.done


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace ``path`` by ``records``, atomically (a kill leaves the old or the new file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def _append(path: Path, record: dict[str, Any]) -> None:
    """One line, flushed and fsynced: a crash loses at most the line being written."""
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
