"""Freed tensor memory kept in the heap (ferret_core.engine.heap): on glibc, a stale gradient's compensation
(temporaries of the stage's size, allocated and freed every call) stops page-faulting once the process keeps
freed memory, where with glibc's defaults each call maps and zeroes megabytes of pages again."""

from __future__ import annotations

import ctypes
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# minor page faults per compensate call of Iter-Fisher's one-step form on MNISTNet's fc1-sized stage, in a
# fresh interpreter: argv[1] "retain" keeps freed memory first
_PROBE = """
import resource, sys
import torch
from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.heap import retain_freed_memory

if sys.argv[1] == "retain":
    assert retain_freed_memory()
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
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_call(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@glibc
def test_a_compensation_stops_page_faulting_once_freed_memory_is_kept() -> None:
    kept = _faults_per_call("retain")
    default = _faults_per_call("default")
    pages = 4.7e6 / 4096  # one temporary of the stage's size
    assert default > pages, f"glibc's defaults re-fault the temporaries: expected > {pages:.0f} a call, got {default}"
    assert kept < 0.1 * default, f"expected under a tenth of the default's {default} faults per call, got {kept}"


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
