"""Freed tensor memory kept in the heap (ferret_core.engine.heap): on glibc, once kept, a 16 MB storage comes
from the heap rather than a fresh mmap, and a stale gradient's compensation (temporaries of the stage's size,
allocated and freed every call) no longer maps and zeroes pages at each call. (How many faults glibc's
defaults cost depends on the process's allocation history, up to ~3,300 a call here: not asserted.)"""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and mallinfo2 are glibc's")

# in a fresh interpreter, argv[1] "retain" keeping freed memory first: the bytes a new 16 MB tensor added to
# glibc's mmapped regions (mallinfo2's hblkhd), then the minor page faults per compensate call of Iter-Fisher's
# one-step form on a stage of MNISTNet's fc1 size
_PROBE = """
import ctypes, resource, sys
import torch
from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.heap import retain_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "retain":
    assert retain_freed_memory()
mapped = libc.mallinfo2().hblkhd
block = torch.empty(4 * 2**20)
mapped = libc.mallinfo2().hblkhd - mapped
del block
torch.set_num_threads(1)
shapes = [(128, 9216), (128,), (10, 128)]  # 4.7 MB of weights
then = [torch.randn(s) for s in shapes]
now = [t + 1e-3 for t in then]
grads = [torch.randn(s) * 1e-2 for s in shapes]
comp = make_compensator("iter-fisher-lean", then, CompensatorSettings(), 2)
for _ in range(5):
    comp.compensate(grads, staleness=1, theta_then=then, theta_now=now)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    comp.compensate(grads, staleness=1, theta_then=then, theta_now=now)
print(mapped, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _probe(mode: str) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    mapped, faults = out.stdout.strip().splitlines()[-1].split()
    return int(mapped), float(faults)


@glibc
def test_a_large_block_comes_from_the_heap_only_once_freed_memory_is_kept() -> None:
    kept, _ = _probe("retain")
    default, _ = _probe("default")
    assert kept == 0, f"expected the 16 MB block from the heap (nothing mmapped), got {kept} bytes mmapped"
    assert default >= 16 * 2**20, f"glibc's defaults mmap a fresh 16 MB block: expected >= 16 MiB, got {default}"


@glibc
def test_a_compensation_does_not_page_fault_once_freed_memory_is_kept() -> None:
    _, faults = _probe("retain")
    pages = 4.7e6 / 4096  # one temporary of the stage's size
    assert faults < 0.2 * pages, f"expected under {0.2 * pages:.0f} minor faults a call (kept memory), got {faults}"


def test_it_does_nothing_and_says_so_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferret_core.engine.heap as heap

    monkeypatch.setattr(heap, "_glibc", lambda: None)
    assert heap.retain_freed_memory() is False


def test_glibc_lookup_refuses_a_c_library_without_mallopt(monkeypatch: pytest.MonkeyPatch) -> None:
    import ferret_core.engine.heap as heap

    class NotGlibc:  # a C library without glibc's symbols (musl, macOS's libSystem)
        pass

    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: NotGlibc())
    assert heap._glibc() is None
