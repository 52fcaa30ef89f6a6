"""Compile the expressions the first questions meet into the disk cache, once an install.

A structure met for the first time costs sympy its expressions and their functions
(:mod:`costmodel.engine.diskcache`): the README's first plan, Llama-3-70B over up to 1,000
H100, 5.75 s on a 2-core machine with an empty cache, 0.84 s with it filled.
``scripts/setup.sh`` runs ``python -m costmodel.cli.prewarm``, which asks the README's
first ``estimate`` and a dense ``plan`` (both frameworks, every recompute policy,
pipelining with and without interleaving: every structure of a dense bf16 GPU plan, which
any other dense model with grouped-query attention shares, its sizes aside) with their
output discarded. What it does not cover (mixture-of-experts, MLA, fp8, TPUs) compiles on
first use as before; ``COSTMODEL_CACHE=off`` leaves nothing to warm.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time

from costmodel.cli import main as cli
from costmodel.engine.diskcache import cache_dir

QUESTIONS = (
    "estimate --model llama3-8b --hardware h100-sxm --gpus 8 --fsdp 8 --framework fsdp2 "
    "--seq 8192 --batch 32 --microbatch 1 --recompute full",
    "plan --model llama3-70b --hardware h100-sxm --seq 8192 --global-batch 1024 --max-gpus 1000",
)
"""The README's first estimate and first plan, as a user types them."""


def main() -> int:
    """Ask each of :data:`QUESTIONS`; one line each on stderr; the exit status of the
    first that fails (a question that fails compiles nothing worth keeping)."""
    if cache_dir() is None:
        print("costmodel prewarm: no disk cache (COSTMODEL_CACHE=off): nothing to warm",
              file=sys.stderr)  # fmt: skip
        return 0
    for question in QUESTIONS:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            status = cli(question.split())
        if status:
            return status
        seconds = time.perf_counter() - start
        print(f"costmodel prewarm: {question.split()[0]} compiled in {seconds:.1f} s",
              file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
