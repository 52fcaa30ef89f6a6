"""What a question answers, one object per question for the CLI, the app and the API: the
numbers and what to say beside them (verdict, nearest fit, caveats). Above ``serve``,
``engine`` and ``catalog``, which it combines (``docs/ARCHITECTURE.md``)."""

from __future__ import annotations

import re


def as_fields(text: str) -> str:
    """An answer's words in the API's: the CLI's flags (``--grad-accum``) as the keyword
    names a call takes (``grad_accum``)."""
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), text)
