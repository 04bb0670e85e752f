"""Keep the memory a search frees in the process, so its next arrays do not fault their pages in again.

A search allocates and frees thousands of numpy temporaries of 0.1-2 MB (a column over every grid
of a mixture of experts is 28,598 rows). glibc's malloc serves such sizes from `mmap` or from the top
of its heap, and hands them back to the kernel when they are freed (`munmap`, or trimming the heap
top past `M_TRIM_THRESHOLD`); the next allocation of that size then faults every page in again. On
the 2-core VM of our CI a minor fault costs about 5 us, and a DeepSeek-V3 search on 16,384 GPUs
took ~3,200 of them (a GPT-3 175B search ~900): a fifth of its time, measured with
`resource.getrusage(...).ru_minflt` around ten searches (`bench/search_speed.py` prints the faults
per search).

`keep_freed_memory()` raises glibc's thresholds once per process (`mallopt`, malloc(3)): arrays up
to 32 MiB come from the heap (`M_MMAP_THRESHOLD`), the heap grows 16 MiB at a time (`M_TOP_PAD`) and
keeps up to 128 MiB of freed memory (`M_TRIM_THRESHOLD`) instead of returning it. The search then
faults a handful of pages. The cost is that much resident memory kept for reuse, which the service
and the CLI can spare. Elsewhere (another C library, another OS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
"""mallopt's parameter numbers (glibc malloc.h)."""

MMAP_THRESHOLD_BYTES = 32 << 20
TOP_PAD_BYTES = 16 << 20
TRIM_THRESHOLD_BYTES = 128 << 20

_done: list[bool] = []


def keep_freed_memory() -> bool:
    """Set the thresholds above (once per process); whether glibc took them."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # musl and others have no mallopt
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            ok = all(mallopt(param, value) == 1 for param, value in (
                (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES), (M_TOP_PAD, TOP_PAD_BYTES),
                (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)))
    _done.append(ok)
    return ok
