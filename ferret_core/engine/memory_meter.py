"""Memory the engine really holds, measured independently of any cost model (DESIGN §3.8).

After every action the engine calls :meth:`MemoryMeter.sample`, which

1. walks every tensor the engine holds, source by source (masters and replicas, stashes and activations
   referenced by in-flight items, accumulated gradients, optimizer state, compensator state) — a source
   yields the tensors' storage keys (``data_ptr``, ``nbytes``), which immutable versions compute once —
   and
2. adds autograd's saved tensors, which no engine structure references: a
   ``torch.autograd.graph.saved_tensors_hooks`` pack hook wraps each saved tensor in a small holder
   object that only the graph references,

and counts each distinct storage once (deduplicated by ``untyped_storage().data_ptr()``, sized by
``untyped_storage().nbytes()``; a weight that autograd saved is the version's own storage, counted once).
Nothing is summed from the plan. On CUDA the meter also reports ``torch.cuda.max_memory_allocated()``
above the allocation that existed when it was created.

An executor *process* runs its own meter over what it holds, excluding the shared version slots and
delta rings (``exclude``), which its coordinator counts once (:mod:`ferret_core.engine.processes.executor`).

Sampling after every action is cheap and still exact (``tests/unit/test_memory_meter.py``
checks it equals a full walk at every sample on random runs):

* **stable sources** (``add_source(..., stable=True)``: versions and optimizer state) only change at an
  update; their keys are cached until :meth:`MemoryMeter.invalidate`, which the engine calls at every
  update (compensators cache their own keys: a delta ring's slots never move);
* **admitted items no action has touched yet** (the admission queue: input and target) keep the storage
  keys read at admission until their first action (``Pipeline._unstarted_keys``), so a sample does not
  walk every waiting item's tensors again: with K items queued that walk is most of a tiny model's
  sample and makes a worker that fell behind slower still (``benchmarks/live/README.md``);
* **saved tensors are grouped by the forward that saved them** (one :meth:`SavedTensorTracker.hooks`
  context = one group). A group lives exactly as long as one of its holders. At the first sample that
  sees it, its keys split into *shared* ones — storages some other source also holds (the stage's input
  and output, the version's weights) — and *private* ones, created inside that forward and referenced by
  nothing but the graph; the private bytes are summed once, and later samples only deduplicate the few
  shared keys. If a group has lost some holders (a graph freed part by part), it is walked holder by
  holder like before.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

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


class _Group:
    """The tensors one forward saved: their keys, how many holders are alive, and (after the first
    sample) which keys are private to the graph."""

    __slots__ = ("__weakref__", "alive", "holders", "keys", "private_bytes", "shared", "size")

    def __init__(self) -> None:
        self.keys: list[StorageKey] = []
        self.holders: weakref.WeakSet[_Saved] = weakref.WeakSet()
        self.alive = 0
        self.size = 0
        self.shared: list[StorageKey] | None = None  # set at the first sample that sees the group
        self.private_bytes = 0


class _Saved:
    __slots__ = ("__weakref__", "group", "key", "tensor")

    def __init__(self, tensor: Tensor, group: _Group) -> None:
        self.tensor = tensor
        self.key = storage_key(tensor)
        self.group = group

    def __del__(self) -> None:
        self.group.alive -= 1


class SavedTensorTracker:
    """Tracks the tensors autograd saves inside :meth:`hooks`, grouped per context (thread-safe; hooks
    are per thread)."""

    def __init__(self) -> None:
        self._groups: weakref.WeakSet[_Group] = weakref.WeakSet()
        self._lock = threading.Lock()

    def hooks(self) -> AbstractContextManager[None]:
        """Track what autograd saves inside the context, as one group."""
        return self._grouped()

    @contextmanager
    def _grouped(self) -> Iterator[None]:
        group = _Group()

        def pack(tensor: Tensor) -> _Saved:
            holder = _Saved(tensor, group)
            group.keys.append(holder.key)
            group.holders.add(holder)
            group.alive += 1
            group.size += 1
            return holder

        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            yield
        if group.size:
            with self._lock:
                self._groups.add(group)

    def groups(self) -> list[_Group]:
        with self._lock:
            return [g for g in self._groups if g.alive > 0]

    def live(self) -> list[StorageKey]:
        """Storages of the saved tensors whose graphs are alive (a full walk)."""
        return [h.key for g in self.groups() for h in list(g.holders)]


def _unpack(holder: _Saved) -> Tensor:
    return holder.tensor


class MemoryMeter:
    """Peak of distinct storages held by named sources plus autograd's saved tensors.

    ``exclude``: storages another meter counts (an executor process's view of the shared version slots and
    delta rings, which its coordinator counts once): never counted here, whichever source or saved tensor
    holds them. ``cuda``: also track the CUDA allocator's peak (False in a process that must not start a
    CUDA context just to read it: the CPU executor processes)."""

    def __init__(
        self,
        sources: Mapping[str, Source],
        tracker: SavedTensorTracker | None = None,
        *,
        exclude: Iterable[StorageKey] = (),
        cuda: bool = True,
    ) -> None:
        self._sources: dict[str, Source] = dict(sources)
        self._stable: dict[str, Source] = {}
        self._stable_keys: dict[str, int] | None = None  # bytes per stable source, cached
        self._excluded = frozenset(ptr for ptr, _ in exclude)
        self._stable_seen: set[int] = set(self._excluded)  # and their storages (plus the excluded ones)
        self.tracker = tracker or SavedTensorTracker()
        self.peak_bytes = 0
        self.last_bytes = 0
        self.samples = 0
        self.peak_breakdown: dict[str, int] = {}
        self.last_breakdown: dict[str, int] = {}
        self._cuda_devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if cuda else []
        self._cuda_baseline = {d: torch.cuda.memory_allocated(d) for d in self._cuda_devices}
        for device in self._cuda_devices:
            torch.cuda.reset_peak_memory_stats(device)

    def add_source(self, name: str, source: Source, *, stable: bool = False) -> None:
        """Count one more holder of tensors (its storages are deduplicated against the others).

        ``stable``: its storages change only where :meth:`invalidate` is called, so they are cached.
        Stable sources are counted first (a storage two sources share is attributed to the first)."""
        if stable:
            self._stable[name] = source
            self._stable_keys = None
        else:
            self._sources[name] = source

    def invalidate(self) -> None:
        """The stable sources changed (call after every update of a version, optimizer or compensator)."""
        self._stable_keys = None

    def sample(self) -> int:
        """Bytes held now; updates :attr:`peak_bytes` and its breakdown by source."""
        if self._stable_keys is None:
            self._stable_seen = set(self._excluded)
            stable = list(self._stable.items())
            self._stable_keys = {name: _count(source(), self._stable_seen) for name, source in stable}
        seen = set(self._stable_seen)
        breakdown: dict[str, int] = dict(self._stable_keys)
        for name, source in list(self._sources.items()):
            breakdown[name] = _count(source(), seen)
        breakdown[SAVED] = self._count_saved(seen)
        total = sum(breakdown.values())
        self.samples += 1
        self.last_bytes = total
        self.last_breakdown = breakdown
        if total > self.peak_bytes:
            self.peak_bytes = total
            self.peak_breakdown = breakdown
        return total

    def walk(self) -> int:
        """What :meth:`sample` counts, by walking every source and every saved tensor with no cache
        (the reference the cached sample is tested against; it does not touch the peak)."""
        seen: set[int] = set(self._excluded)
        total = sum(_count(source(), seen) for source in (*self._stable.values(), *self._sources.values()))
        return total + _count(self.tracker.live(), seen)

    def _count_saved(self, seen: set[int]) -> int:
        total = 0
        for group in self.tracker.groups():
            if group.alive < group.size:  # partly freed: walk what is left
                total += _count([h.key for h in list(group.holders)], seen)
                continue
            if group.shared is None:
                _classify(group, seen)
            total += group.private_bytes + _count(group.shared or (), seen)
        return total

    def cuda_peak_bytes(self) -> int | None:
        """``max_memory_allocated`` above the baseline, summed over devices; ``None`` without CUDA."""
        if not self._cuda_devices:
            return None
        return sum(
            max(0, torch.cuda.max_memory_allocated(d) - self._cuda_baseline[d]) for d in self._cuda_devices
        )


def _classify(group: _Group, seen: set[int]) -> None:
    """Split a group's keys into those another source holds (shared) and the graph's own (private),
    and sum the private bytes once. Called with ``seen`` = every other source's storages."""
    shared: list[StorageKey] = []
    private: dict[int, int] = {}
    for ptr, nbytes in group.keys:
        if ptr == 0:
            continue
        if ptr in seen:
            shared.append((ptr, nbytes))
        else:
            private[ptr] = nbytes
    group.shared = shared
    group.private_bytes = sum(private.values())
    group.keys = []


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
