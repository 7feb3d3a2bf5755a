"""Memory the engine really holds, measured independently of any cost model (DESIGN §3.8).

After every action the engine calls :meth:`MemoryMeter.sample`, which

1. walks every tensor the engine holds, source by source (masters and replicas, stashes and activations
   referenced by in-flight items, pending gradients, optimizer state, compensator state) — a source
   yields the tensors' storage keys (``data_ptr``, ``nbytes``), which immutable versions compute once —
   and
2. adds autograd's saved tensors, which no engine structure references: a
   ``torch.autograd.graph.saved_tensors_hooks`` pack hook wraps each saved tensor in a small holder
   object that only the graph references; the tracker keeps the holders in a weak set, so a holder
   disappears from it when its graph is freed,

and counts each distinct storage once (deduplicated by ``untyped_storage().data_ptr()``, sized by
``untyped_storage().nbytes()``; a weight that autograd saved is the version's own storage, counted once).
Nothing is summed from the plan. On CUDA the meter also reports ``torch.cuda.max_memory_allocated()``
above the allocation that existed when it was created.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager

import torch
from torch import Tensor

StorageKey = tuple[int, int]  # (data_ptr, nbytes) of an untyped storage
Source = Callable[[], Iterable[StorageKey]]
SAVED = "autograd_saved"


def storage_key(tensor: Tensor) -> StorageKey:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def storage_keys(tensors: Iterable[Tensor]) -> Iterator[StorageKey]:
    for tensor in tensors:
        yield storage_key(tensor)


class _Saved:
    __slots__ = ("__weakref__", "key", "tensor")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor
        self.key = storage_key(tensor)


class SavedTensorTracker:
    """Tracks the tensors autograd saves inside :meth:`hooks` (thread-safe; hooks are per thread)."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet[_Saved] = weakref.WeakSet()
        self._lock = threading.Lock()

    def hooks(self) -> AbstractContextManager[None]:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def live(self) -> list[StorageKey]:
        """Storages of the saved tensors whose graphs are alive."""
        with self._lock:
            holders = list(self._live)
        return [h.key for h in holders]

    def _pack(self, tensor: Tensor) -> _Saved:
        holder = _Saved(tensor)
        with self._lock:
            self._live.add(holder)
        return holder

    @staticmethod
    def _unpack(holder: _Saved) -> Tensor:
        return holder.tensor


class MemoryMeter:
    """Peak of distinct storages held by named sources plus autograd's saved tensors."""

    def __init__(self, sources: Mapping[str, Source], tracker: SavedTensorTracker | None = None) -> None:
        self._sources: dict[str, Source] = dict(sources)
        self.tracker = tracker or SavedTensorTracker()
        self.peak_bytes = 0
        self.last_bytes = 0
        self.samples = 0
        self.peak_breakdown: dict[str, int] = {}
        self.last_breakdown: dict[str, int] = {}
        self._cuda_devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        self._cuda_baseline = {d: torch.cuda.memory_allocated(d) for d in self._cuda_devices}
        for device in self._cuda_devices:
            torch.cuda.reset_peak_memory_stats(device)

    def add_source(self, name: str, source: Source) -> None:
        """Count one more holder of tensors (its storages are deduplicated against the others)."""
        self._sources[name] = source

    def sample(self) -> int:
        """Bytes held now; updates :attr:`peak_bytes` and its breakdown by source."""
        seen: set[int] = set()
        breakdown: dict[str, int] = {}
        for name, source in list(self._sources.items()):
            breakdown[name] = _count(source(), seen)
        breakdown[SAVED] = _count(self.tracker.live(), seen)
        total = sum(breakdown.values())
        self.samples += 1
        self.last_bytes = total
        self.last_breakdown = breakdown
        if total > self.peak_bytes:
            self.peak_bytes = total
            self.peak_breakdown = breakdown
        return total

    def cuda_peak_bytes(self) -> int | None:
        """``max_memory_allocated`` above the baseline, summed over devices; ``None`` without CUDA."""
        if not self._cuda_devices:
            return None
        return sum(
            max(0, torch.cuda.max_memory_allocated(d) - self._cuda_baseline[d]) for d in self._cuda_devices
        )


def storage_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    return _count(storage_keys(tensors), set())


def _count(keys: Iterable[StorageKey], seen: set[int]) -> int:
    total = 0
    for ptr, nbytes in keys:
        # one address space: CUDA's unified addressing keeps device pointers distinct from host ones
        if ptr == 0 or ptr in seen:
            continue
        seen.add(ptr)
        total += nbytes
    return total
