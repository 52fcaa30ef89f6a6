"""The calibration's measurements, one JSON line each, written as they are taken.

``OUT/measurements.jsonl`` starts with the run's header (world size, ranks per node,
backend, ``--quick``) and then holds one record per measurement, keyed (``net/cross2/
all_reduce/4194304``, ``gemm/bf16/2048x4096x4096``, ...), flushed and fsynced by rank 0 as
soon as every rank has reported it. ``--resume`` keeps the readable records of a run on the
same cluster shape and measures only the rest: every rank learns the finished keys from
rank 0, so all skip the same collectives and none waits for a peer that moved on. The
profile is then assembled from the file, old records and new alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist

from validate.report.results import _append, _parse_jsonl, _plain, _rewrite

FILE = "measurements.jsonl"


class MeasurementLog:
    """Rank 0 owns the file; every rank holds the set of finished keys."""

    def __init__(self, out: Path, header: dict[str, Any], resume: bool, rank: int) -> None:
        self.path, self.rank = out / FILE, rank
        records: dict[str, dict[str, Any]] = {}
        error = ""
        if rank == 0:
            try:
                records = _open(self.path, header, resume)
            except (ValueError, OSError) as err:
                error = str(err)
        shared = [error, sorted(records)]
        dist.broadcast_object_list(shared, src=0)
        if shared[0]:
            raise SystemExit(f"validate.cluster: {shared[0]}")
        self.done: set[str] = set(shared[1])
        self.records = records  # rank 0 only

    def has(self, key: str) -> bool:
        return key in self.done

    def add(self, key: str, record: dict[str, Any]) -> None:
        """Record a measurement (every rank calls it; rank 0 writes)."""
        self.done.add(key)
        if self.rank == 0:
            record = _plain({"key": key, **record})
            _append(self.path, record)
            self.records[key] = record


def _open(path: Path, header: dict[str, Any], resume: bool) -> dict[str, dict[str, Any]]:
    """The finished records by key (rank 0): a new file with ``header``, or on ``resume``
    the old one's readable records after checking it measured the same cluster shape."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not resume:
        raise ValueError(
            f"--out {path.parent} already holds measurements: pass --resume to "
            "continue that run or choose another --out"
        )
    lines = [r for r in _parse_jsonl(path)[0] if isinstance(r, dict) and "key" in r]
    old = next((r for r in lines if r["key"] == "run"), None)
    if old is not None:
        stated = {k: old.get(k) for k in header}
        if stated != _plain(header):
            raise ValueError(f"--resume: {path} measured {stated}, this run is {_plain(header)}")
    records = {r["key"]: r for r in lines if r["key"] != "run"}
    _rewrite(path, [_plain({"key": "run", **header}), *records.values()])
    return records
