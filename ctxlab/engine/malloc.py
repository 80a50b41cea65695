"""Keep large temporaries in the heap instead of mapping fresh pages for each one.

A step allocates tens of MiB per layer (the fused gate|up output of a 4,096-token chunk is
48 MiB; a decode step's gathered K/V are tens of MiB). glibc serves blocks above its mmap
threshold (at most 32 MiB) with a fresh `mmap` and unmaps them on free, so every such
tensor pays a page fault per 4 KiB page: on the development CPU a gather + SDPA over 59 MB
took 138 ms with fresh pages and 42 ms with reused ones. Raising the mmap and trim thresholds
makes freed blocks stay in the heap for the next layer. The price is that the process keeps
its peak heap instead of returning it to the OS, as a serving engine does anyway.

Process-wide and idempotent; a no-op off glibc or with CTXLAB_NO_MALLOPT=1.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def keep_heap_pages(threshold: int = 1 << 30) -> bool:
    """Serve blocks below `threshold` bytes from the heap and never trim it; True if set."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or os.environ.get("CTXLAB_NO_MALLOPT") == "1":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
    )
    _done = ok
    return ok
