"""``python -m validate.published --loso``: the run, its files and ``--record``
(:mod:`validate.published.__main__` documents the command). Torch-free."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from costmodel.catalog.fitted import LOSO_SENTENCE, fitted, loso_sentence
from validate.published import loso
from validate.published.journal import FoldJournal
from validate.published.loso_report import markdown, text

FITTED = Path(str(resources.files("costmodel.catalog").joinpath("data/fitted.json")))


def records_key(paths: list[Path]) -> str:
    """A hash of the records' definitions (their figures left out) and of every corpus
    file: a journal written for other records or other runs is not resumed."""
    data = json.loads(FITTED.read_text())
    defs = {k: {f: v for f, v in r.items() if f != "figures"} if isinstance(r, dict) else r
            for k, r in data.items()}  # fmt: skip
    h = hashlib.sha256(json.dumps(defs, sort_keys=True).encode())
    for path in paths:
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:16]


def dumps(data: dict[str, Any]) -> str:
    """JSON as the records file keeps it: one level per line, lists of numbers on one."""
    text = json.dumps(data, indent=1)
    flat = re.compile(r"\[\s*((?:-?[\d.e+-]+,\s*)*-?[\d.e+-]+)\s*\]")
    one_line = flat.sub(lambda m: "[" + ", ".join(x.strip() for x in m[1].split(",")) + "]", text)
    return one_line + "\n"


def record(figures: dict[str, dict[str, Any]]) -> None:
    """Write each record's figures into ``costmodel/catalog/data/fitted.json`` and the
    sentence quoting them at the end of ``hardware.json``'s ``_notes``."""
    data = json.loads(FITTED.read_text())
    for name, figs in figures.items():
        data[name]["figures"] = figs
    FITTED.write_text(dumps(data))
    fitted.cache_clear()
    path = FITTED.parent / "hardware.json"
    catalog = json.loads(path.read_text())
    notes = catalog["_notes"]
    kept = notes.split(LOSO_SENTENCE)[0].rstrip()
    catalog["_notes"] = f"{kept} {loso_sentence()}"
    path.write_text(json.dumps(catalog, indent=1, ensure_ascii=False) + "\n")


def main(out: Path, resume: bool, write: bool) -> int:
    files = [*loso.TRAINING_FILES, *loso.SERVING_FILES]
    try:
        out.mkdir(parents=True, exist_ok=True)
        journal = FoldJournal(out / "loso.jsonl", resume, records_key(files))
    except OSError as err:
        print(f"error: out: cannot write {out}: {err.strerror or err}", file=sys.stderr)
        return 2
    records = fitted()
    targets, skipped = loso.corpus()
    print(f"{len(targets)} measured numbers of {len({t.source for t in targets})} sources; "
          f"{len(skipped)} runs not predicted", file=sys.stderr)  # fmt: skip
    result = loso.run(records, targets, lambda line: print(line, file=sys.stderr), journal)
    (out / "loso.md").write_text(markdown(result, records, skipped))
    print(text(result, records))
    if write:
        record(loso.figures(result, records))
        print(f"recorded the figures in {FITTED}")
    print(f"wrote {out / 'loso.jsonl'}, {out / 'loso.md'}")
    return 0
