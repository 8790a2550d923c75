"""psyche's PyTorch worker: model, training, DisTrO, served over ZeroMQ to the TypeScript client."""

import ctypes as _ctypes
import os as _os
import sys as _sys

# Recorded before the slow imports (torch) so a parent that dies during start-up is still noticed.
STARTUP_PARENT_PID = _os.getppid()


def reuse_freed_memory() -> None:
    """Keep freed memory in the process for the next allocation (glibc; elsewhere nothing changes). glibc maps every
    block above 32 MiB afresh and unmaps it when freed, so each step's large tensors (activations, DisTrO's
    coefficients) cost page faults on every touch: on CPU that was half of DisTrO's time (bench/README.md). Like
    the CUDA caching allocator, the worker keeps its peak."""
    if not _sys.platform.startswith("linux"):
        return
    try:
        libc = _ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX: no block from mmap, all from the heap, reused when freed
        libc.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD: give the top of the heap back only past 2 GiB free
    except (OSError, AttributeError):
        pass  # not glibc (musl has no mallopt)
