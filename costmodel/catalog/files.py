"""Reading a file a user names (a hardware profile, a config.json, a lengths file): a
regular file of at most a stated size, or one line saying which field and why.

A FIFO or a device such as ``/dev/zero`` would block or never end a read, so only regular
files are opened; a limit bounds what is read; JSON nested past the parser's recursion
limit is refused as such rather than as a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from costmodel.specs.checks import SpecError

MAX_BYTES = 16 * 2**20
"""The most a configuration file may hold (a Hugging Face config.json is a few kB)."""


def read_bytes(path: str | Path, field: str, limit: int = MAX_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` + 1 of them (one more
    than allowed, so that :func:`parse_json` can tell a file past the limit)."""
    p = Path(path)
    try:
        if not p.is_file():
            what = "does not exist" if not p.exists() else "is not a regular file"
            raise SpecError(field, f"{field}: {p} {what}")
        with p.open("rb") as f:
            return f.read(limit + 1)
    except OSError as err:
        raise SpecError(field, f"{field}: cannot read {p}: {err.strerror or err}") from None


def parse_json(data: bytes, source: str | Path, field: str, limit: int = MAX_BYTES) -> Any:
    """The JSON value in ``data`` (read from ``source``, or uploaded), with one sentence
    for what a parser can raise."""
    if len(data) > limit:
        size = f"{limit // 2**20} MiB" if limit >= 2**20 else f"{limit:,} bytes"
        raise SpecError(field, f"{field}: {source} is larger than {size}")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise SpecError(field, f"{field}: {source} is not UTF-8 text (byte "
                        f"{data[err.start]:#04x} at offset {err.start})") from None  # fmt: skip
    except RecursionError:
        raise SpecError(field, f"{field}: {source} holds JSON nested too deeply") from None
    except json.JSONDecodeError as err:
        raise SpecError(field, f"{field}: {source} is not valid JSON ({err.msg}, line "
                        f"{err.lineno})") from None  # fmt: skip


def read_json(path: str | Path, field: str, limit: int = MAX_BYTES) -> Any:
    """The JSON value in the regular file ``path``."""
    return parse_json(read_bytes(path, field, limit), path, field, limit)
