"""Keep freed tensor memory in the process's heap: glibc's ``mallopt`` for batch-1 training.

torch allocates a CPU tensor's storage with the C library's ``malloc``. glibc serves a block above its
mmap threshold with a fresh ``mmap`` and unmaps it at ``free``; the threshold starts at 128 KiB and rises
to the size of each such block freed, and the heap's free top is given back to the system past the trim
threshold (twice the mmap threshold). A batch-1 step allocates and frees blocks of the stage's size every
item: a stale gradient's compensation holds several temporaries of it at once (MNISTNet's 4.7 MB fc1,
Iter-Fisher's one-step form), their sum can pass the trim threshold, and then the next call maps and
zeroes those pages again: about 3,300 minor page faults per call in a process where it happened, 0–60
once freed memory is kept (``tests/unit/test_heap.py`` asserts the latter; whether glibc's defaults give
the pages back depends on the process's allocation history, so two processes can differ). Measured on 2
worker processes of MNISTNet at saturation, interleaved, 5 repeats (``benchmarks/distributed/README.md`` §
"Freed memory kept"): keeping it trained 1.09–1.41× the items/s of glibc's defaults with a compensator
(Iter-Fisher's one-step form, the trainer's default: 1.41×, its compensation 0.65× the time per trained
item) and 1.08× without one.

:func:`retain_freed_memory` sets both thresholds high (``M_MMAP_THRESHOLD`` 32 MiB, the most glibc takes
on 64-bit hosts: blocks below it come from the heap; ``M_TRIM_THRESHOLD`` 1 GiB: freed heap memory is
kept), so a freed block is reused without a fault. What it costs: the process keeps the peak of what it
had allocated (its resident set does not shrink after a transient peak); the tensors it holds are
unchanged, and those are what the memory meter (:mod:`ferret_core.engine.memory_meter`) and the budget
count. The PyTorch performance guide gets the same effect by swapping in jemalloc or tcmalloc; this needs
no library beyond glibc.

Where the C library is not glibc (musl, macOS) it does nothing and says so (returns False).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # blocks below it come from the heap (glibc's ceiling on 64-bit hosts)
TRIM_THRESHOLD_BYTES = 2**30  # freed heap memory up to this much is kept


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def retain_freed_memory(
    mmap_threshold: int = MMAP_THRESHOLD_BYTES, trim_threshold: int = TRIM_THRESHOLD_BYTES
) -> bool:
    """Set this process's glibc thresholds (module docstring); True where both took effect, False where
    the C library is not glibc or refused a value (then nothing is assumed about the heap)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on error (a value out of its range)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))
