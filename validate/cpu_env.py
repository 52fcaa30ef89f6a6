"""Run CPU measurements under a caching allocator, as GPU runs are.

glibc returns every large freed block to the OS and maps fresh zero pages for the next
allocation, so on CPU each out-of-place op on a large tensor pays page faults: an
elementwise add on 256 MiB runs at ~8 GB/s instead of ~40 GB/s on the 2-core CI machine.
PyTorch's CPU performance guide recommends a caching allocator (jemalloc/tcmalloc); the
glibc tunables below have the same effect without a library to install: allocations up to
4 GiB come from the heap, and freed memory is kept for reuse. CUDA's caching allocator
already behaves so, which makes CPU and GPU measurements comparable.
"""

from __future__ import annotations

import os
import platform
import sys

ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def caching_allocator_active() -> bool:
    return all(os.environ.get(k) == v for k, v in ALLOCATOR_ENV.items())


def reexec_with_caching_allocator(module: str) -> None:
    """Restart ``python -m module <same args>`` with the allocator tunables (glibc only).

    glibc reads them at process start, so they cannot be set from inside. No-op when they
    are already set, on other C libraries, or when ``COSTMODEL_NO_REEXEC`` is set.
    """
    if caching_allocator_active() or os.environ.get("COSTMODEL_NO_REEXEC"):
        return
    if platform.libc_ver()[0] != "glibc":
        return
    env = {**os.environ, **ALLOCATOR_ENV}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)
