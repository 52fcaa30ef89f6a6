"""What ``python -m validate.published`` has finished, so an interrupted run resumes exactly.

``OUT/rows.jsonl`` gets each run's rows as soon as they are computed and ``OUT/runs.jsonl``
then one line naming the run, a hash of its JSON and its row count; both flushed and
fsynced (``validate.report.results``). ``--resume`` keeps a run's rows only where its line
is there, its row count matches the readable rows and its hash matches the run in
``--runs`` now (an edited run is predicted again); both files are rewritten without the
rest, so the next append starts clean. Without ``--resume`` a run starts over.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from validate.report.results import _append, _parse_jsonl, _plain, _rewrite


def run_hash(run: Any) -> str:
    return hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()


class Journal:
    def __init__(self, out: Path, resume: bool) -> None:
        self.rows_path, self.runs_path = out / "rows.jsonl", out / "runs.jsonl"
        self.finished: dict[str, str] = {}  # run id -> hash
        self.rows: list[dict[str, Any]] = []
        if resume:
            self._resume()
        else:
            for path in (self.rows_path, self.runs_path):
                path.unlink(missing_ok=True)

    def _resume(self) -> None:
        rows = [r for r in _parse_jsonl(self.rows_path)[0] if isinstance(r, dict) and "case" in r]
        counts = Counter(r["case"] for r in rows)
        lines = [d for d in _parse_jsonl(self.runs_path)[0]
                 if isinstance(d, dict) and {"case", "hash", "rows"} <= set(d)]  # fmt: skip
        done = {d["case"]: d for d in lines if d["rows"] == counts[d["case"]]}
        self.finished = {case: d["hash"] for case, d in done.items()}
        self.rows = [r for r in rows if r["case"] in done]
        _rewrite(self.rows_path, self.rows)
        _rewrite(self.runs_path, list(done.values()))

    def done(self, rid: str, run: Any) -> list[dict[str, Any]] | None:
        """The kept rows of ``run`` (None: predict it), dropping them if it was edited."""
        if self.finished.get(rid) == run_hash(run):
            return [r for r in self.rows if r["case"] == rid]
        return None

    def add(self, rid: str, run: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Write ``run``'s rows, then its line; the rows as written (JSON-safe: a number
        that is not finite becomes null), which a resumed run reads back alike."""
        rows = [_plain(r) for r in rows]
        for row in rows:
            _append(self.rows_path, row)
        _append(self.runs_path, {"case": rid, "hash": run_hash(run), "rows": len(rows)})
        return rows


class FoldJournal:
    """The folds ``python -m validate.published --loso`` has finished: ``OUT/loso.jsonl``,
    one line per fold (its source, the values refitted without it, its rows), flushed and
    fsynced as it finishes. ``--resume`` keeps the folds of a file written for the same
    records (their definitions hashed into every line); without it the file starts over."""

    def __init__(self, path: Path, resume: bool, key: str) -> None:
        self.path, self.key = path, key
        self.folds: dict[str | None, tuple[dict, list]] = {}
        if resume:
            lines = [d for d in _parse_jsonl(path)[0]
                     if isinstance(d, dict) and d.get("key") == key and "values" in d]  # fmt: skip
            for d in lines:
                values = {n: tuple(v) for n, v in d["values"].items()}
                self.folds[d.get("fold")] = (values, d.get("rows", []))
            _rewrite(path, lines)
        else:
            path.unlink(missing_ok=True)

    def done(self, source: str | None) -> tuple[dict, list] | None:
        return self.folds.get(source)

    def add(self, source: str | None, assignment: dict, rows: list[dict[str, Any]]) -> None:
        line = {"key": self.key, "fold": source,
                "values": {n: list(v) for n, v in assignment.items()},
                "rows": [_plain(r) for r in rows]}  # fmt: skip
        _append(self.path, line)
        self.folds[source] = (assignment, rows)
