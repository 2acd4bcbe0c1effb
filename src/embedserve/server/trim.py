"""Handing the heap memory a large request freed back to the OS, once the engine is idle."""

from __future__ import annotations

import contextlib
import ctypes

# After this many tokens since the last time, an idle engine thread hands freed memory back to
# the OS (`release_free_memory`).
TRIM_AFTER_TOKENS = 1 << 17


def release_free_memory() -> None:
    """glibc keeps freed heap memory for reuse, so a server's resident memory stayed at its
    high-water mark after a large request (benchmarks/memory_cpu.py: a 1,200-passage request on
    the 2-core CPU peaked at 865 MB, 386 idle); with this called once the engine thread is idle
    again, it came back to 433 MB.
    The next large request takes the memory again. A no-op where there is no glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
