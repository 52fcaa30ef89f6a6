"""Run CPU measurements under a caching allocator, as GPU runs are.

glibc returns large freed blocks to the OS and maps fresh zero pages for the next
allocation, so on CPU each out-of-place op on a large tensor pays page faults: a 256 MiB
``x * 2`` runs at ~8 GB/s instead of ~30 GB/s on the 2-core CI machine, and naive
attention's N x N temporaries run several times slower than their memory traffic says.
PyTorch's CPU performance guide recommends a caching allocator: jemalloc (Debian's
``libjemalloc2``) with page decay off keeps freed pages for reuse, as CUDA's caching
allocator does. Without it, glibc tunables do the same for blocks up to the heap limits
(less reliably above ~100 MB).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

_MARK = "COSTMODEL_ALLOCATOR"
_JEMALLOC = [f"/usr/lib/{arch}-linux-gnu/libjemalloc.so.2" for arch in ("x86_64", "aarch64")] + [
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
]
JEMALLOC_CONF = "retain:true,dirty_decay_ms:-1,muzzy_decay_ms:-1"
GLIBC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def allocator_env() -> dict[str, str]:
    """Environment for a caching allocator: jemalloc if installed, else glibc tunables."""
    jemalloc = next((p for p in _JEMALLOC if Path(p).exists()), None)
    if jemalloc:
        preload = " ".join(filter(None, [jemalloc, os.environ.get("LD_PRELOAD")]))
        return {"LD_PRELOAD": preload, "MALLOC_CONF": JEMALLOC_CONF, _MARK: "jemalloc"}
    return {**GLIBC_ENV, _MARK: "glibc-tunables"}


def active_allocator() -> str:
    """``jemalloc``, ``glibc-tunables`` or ``default`` (not re-executed)."""
    return os.environ.get(_MARK, "default")


def reexec_with_caching_allocator(module: str) -> None:
    """Restart ``python -m module <same args>`` under :func:`allocator_env` (Linux only).

    The allocator is chosen at process start, so it cannot be set from inside. No-op when
    already done, off Linux, or when ``COSTMODEL_NO_REEXEC`` is set.
    """
    if _MARK in os.environ or os.environ.get("COSTMODEL_NO_REEXEC"):
        return
    if platform.system() != "Linux":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**os.environ, **allocator_env()}
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)
