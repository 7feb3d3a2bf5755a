"""One stage's model versions in shared memory, for executors that are processes (DESIGN §3.13).

The thread engine's versions are immutable Python objects whose lifetime reference counting decides
(:mod:`ferret_core.engine.versions`). Across processes the same rules need explicit ownership: a stage
keeps ``K`` preallocated parameter *slots* in shared memory, each with the master version it holds and a
reader count, under one cross-process lock:

* the **master** is the slot marked current;
* worker n's **replica** is the slot it pinned at its own last update (or version 0): its forwards read
  it, and it changes only at the worker's own update points, as on the other clocks;
* a **stash** is a pin an in-flight item holds from its forward to its backward, so the backward and the
  compensation read the weights the forward read;
* a prediction pins the master for the duration of its forward pass.

Two cross-process locks per stage: :attr:`SharedStageVersions.lock` guards the slot table (pins, the
current slot; held for microseconds), :attr:`SharedStageVersions.update_lock` serialises the stage's
updates (compensation, optimizer step, publish), as the thread engine's stage lock does, so a reader
never waits for an optimizer step. An update writes the new master into a slot nobody reads (reader
count 0, not current) and then marks it current: no slot is ever written while it is read, so a reader
needs no lock beyond its pin. Where the master's only reader is the updating worker's own replica (one
worker; or the others' replicas and stashes all older), the update writes the master in place instead,
holding the slot table's lock for the write (plain SGD's memory traffic, as the thread engine's
in-place update). Buffers (eval-mode statistics) never change in training and are shared
once.

Slots needed per stage j, at most: the master, one replica per live worker, one stash per item in flight
at j (at most P − j per worker), one prediction and the slot an update writes into.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from ferret_core.engine.memory_meter import StorageKey, storage_key
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ScheduleError
from ferret_core.planning.memory_model import process_version_slots

_CURRENT = 0  # meta[0]: the current slot; meta[1 + k]: version of slot k; meta[1 + K + k]: readers of slot k


class Lock(Protocol):
    """A cross-process lock (``multiprocessing`` context's ``Lock``)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> Any: ...

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool: ...

    def release(self) -> None: ...


LOCK_POLL_S = 0.05  # how often a watched wait for the slot table's lock asks whether the clock failed


def _shared(tensor: Tensor) -> Tensor:
    """``tensor`` moved into shared memory (in place)."""
    tensor.share_memory_()  # type: ignore[no-untyped-call]
    return tensor


def _alias(flat: Tensor, offset: int, shape: tuple[int, ...]) -> Tensor:
    """A tensor over ``flat``'s storage at ``offset`` with ``shape`` that is *not* a view of ``flat``: it has
    a version counter of its own, so writing one slot does not look to autograd like a write to a tensor
    a graph saved from another slot (views of one buffer share one counter)."""
    alias = torch.empty(0, dtype=flat.dtype)
    with torch.no_grad():
        alias.set_(flat.untyped_storage(), offset, shape, _contiguous_strides(shape))
    return alias


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def slots_needed(live_workers: int, num_stages: int, stage: int) -> int:
    """K for ``stage``: master, replicas, stashes (P − j per worker), one prediction, one being written
    (the byte model's :func:`~ferret_core.planning.memory_model.process_version_slots`)."""
    return process_version_slots(live_workers, num_stages, stage)


class FlatTensors:
    """Tensors of any shapes and dtypes held in one shared flat buffer per dtype, so a process receiving
    them gets one shared-memory handle per dtype, not one per tensor (a forkserver passes at most a few
    hundred handles to a new process: ResNet-18's 62 parameters times K slots would not fit). Picklable
    to a ``torch.multiprocessing`` child; the views are rebuilt in each process."""

    def __init__(self, like: Sequence[Tensor], copies: int) -> None:
        self.copies = copies
        self._layout = [(tuple(t.shape), t.dtype) for t in like]
        sizes: dict[torch.dtype, int] = {}
        self._offsets: list[int] = []
        for shape, dtype in self._layout:
            self._offsets.append(sizes.get(dtype, 0))
            sizes[dtype] = sizes.get(dtype, 0) + math.prod(shape)
        self._sizes = sizes
        self._flat = {dtype: _shared(torch.zeros(copies * n, dtype=dtype)) for dtype, n in sizes.items()}

    def views(self) -> tuple[tuple[Tensor, ...], ...]:
        """Per copy, the tensors in ``like``'s order (views of the flat buffers; cached per process)."""
        cached = self.__dict__.get("_views")
        if cached is None:
            cached = self.__dict__["_views"] = tuple(
                tuple(
                    _alias(self._flat[dtype], k * self._sizes[dtype] + offset, shape)
                    for (shape, dtype), offset in zip(self._layout, self._offsets, strict=True)
                )
                for k in range(self.copies)
            )
        return cached

    def regions(self, copy: int) -> list[Tensor]:
        """Copy ``copy`` as one contiguous 1-D view per dtype (in a fixed order): what a process sends or
        receives whole, without a copy of its own (the follower copies over several hosts)."""
        return [self._flat[dtype][copy * n : (copy + 1) * n] for dtype, n in self._sizes.items()]

    def nbytes(self) -> int:
        return int(sum(t.numel() * t.element_size() for t in self._flat.values()))

    def storages(self) -> list[StorageKey]:
        """The shared buffers' storage keys in this process (what an executor's memory meter excludes:
        every view of a copy is an alias of these storages)."""
        return [storage_key(t) for t in self._flat.values()]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_views", None)
        return state


class SharedStageVersions:
    """``K`` version slots of one stage in shared memory (see the module docstring). Picklable to a child
    process started by a ``torch.multiprocessing`` context: the tensors travel as shared-memory handles
    (one per dtype, :class:`FlatTensors`) and the locks as the context's locks, so every process reads
    and writes the same slots."""

    def __init__(self, initial: StageVersion, slots: int, lock: Lock, update_lock: Lock) -> None:
        if slots < 3:
            raise ScheduleError(f"a stage needs at least 3 version slots (master, replica, update), got {slots}")
        self.stage = initial.stage
        self.num_slots = slots
        self.lock = lock
        self.update_lock = update_lock
        self._params = FlatTensors(initial.params, slots)
        self._buffers = FlatTensors(initial.buffers, 1)
        self.meta = _shared(torch.zeros(1 + 2 * slots, dtype=torch.int64))
        with torch.no_grad():
            for dst, src in zip(self.params[0], initial.params, strict=True):
                dst.copy_(src)
            for dst, src in zip(self.buffers, initial.buffers, strict=True):
                dst.copy_(src)
        self._table[1] = initial.version

    @property
    def params(self) -> tuple[tuple[Tensor, ...], ...]:
        """Per slot, the stage's parameter tensors (shared memory)."""
        return self._params.views()

    @property
    def buffers(self) -> tuple[Tensor, ...]:
        """The stage's buffers (shared memory; they never change in training)."""
        return self._buffers.views()[0]

    @property
    def _table(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The slot table as a numpy view of the shared tensor (an element op costs ~0.1 µs instead of a
        torch indexing call's several µs; made per process, never pickled)."""
        table = self.__dict__.get("_table_view")
        if table is None:
            table = self.__dict__["_table_view"] = self.meta.numpy()
        return table

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_table_view", None)
        state.pop("_abandoned", None)
        state.pop("_version_views", None)
        return state

    def watch(self, abandoned: Callable[[], bool]) -> None:
        """In this process, wait for the slot table's lock only while ``abandoned()`` is false: an executor
        killed while holding it (kill -9 between two lines) never releases it, and the coordinator, which
        learns of the death from the process's sentinel, must not wait for it forever."""
        self.__dict__["_abandoned"] = abandoned

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        abandoned: Callable[[], bool] | None = self.__dict__.get("_abandoned")
        if abandoned is None:
            with self.lock:
                yield
            return
        while not self.lock.acquire(timeout=LOCK_POLL_S):
            if abandoned():
                raise ScheduleError(
                    f"stage {self.stage}: the version slots' lock is held by an executor that failed; the clock "
                    "has stopped (its failure is raised by submit, drain or close)"
                )
        try:
            yield
        finally:
            self.lock.release()

    # ------------------------------------------------------------------------------- read (any process)
    def view(self, slot: int, version: int) -> StageVersion:
        """Slot ``slot`` as a version (the caller holds a pin on it, and read ``version`` when it pinned);
        made once per (slot, version) in each process, not at every action."""
        views: dict[int, StageVersion] = self.__dict__.setdefault("_version_views", {})
        cached = views.get(slot)
        if cached is None or cached.version != version:
            cached = views[slot] = StageVersion(self.stage, version, self.params[slot], self.buffers)
        return cached

    def pin_current(self) -> tuple[int, int]:
        """Pin the master: (slot, version). Unpin it when done reading."""
        with self._holding():
            slot = int(self._table[_CURRENT])
            self._table[1 + self.num_slots + slot] += 1
            return slot, int(self._table[1 + slot])

    def pin(self, slot: int) -> int:
        """Add a reader to ``slot`` (which the caller already reads through a pin): its version."""
        with self._holding():
            self._table[1 + self.num_slots + slot] += 1
            return int(self._table[1 + slot])

    def unpin(self, slot: int) -> None:
        with self._holding():
            self._unpin(slot)

    def current_version(self) -> int:
        with self._holding():
            return int(self._table[1 + int(self._table[_CURRENT])])

    def readers(self) -> list[int]:
        """Reader count of every slot (for tests and diagnostics)."""
        with self._holding():
            return [int(r) for r in self._table[1 + self.num_slots :]]

    # ------------------------------------------------------------ update (call under the update lock)
    def current(self) -> tuple[int, int]:
        """(slot, version) of the master. Under :attr:`update_lock` it stays the master (and is not
        written) until the caller publishes."""
        with self._holding():
            slot = int(self._table[_CURRENT])
            return slot, int(self._table[1 + slot])

    def free_slot(self) -> int:
        """A slot nobody reads and that is not the master, to write the next master into (under
        :attr:`update_lock` no one else picks it). Raises :class:`ScheduleError` when every slot is taken
        (more readers than the schedule allows: a bug)."""
        with self._holding():
            current = int(self._table[_CURRENT])
            readers = [int(r) for r in self._table[1 + self.num_slots :]]
        for slot, count in enumerate(readers):
            if count == 0 and slot != current:
                return slot
        raise ScheduleError(
            f"stage {self.stage}: all {self.num_slots} version slots are read (readers {readers}); the schedule "
            "holds more versions than slots_needed allows"
        )

    def publish(self, slot: int, version: int, *, replica: int | None = None) -> None:
        """Make ``slot`` (just written) the master at ``version``; with ``replica`` (the publishing
        worker's old replica slot), move that worker's replica pin to the new master in the same step."""
        with self._holding():
            self._table[1 + slot] = version
            self._table[_CURRENT] = slot
            if replica is not None:
                self._table[1 + self.num_slots + slot] += 1
                self._unpin(replica)

    def write_in_place(self, slot: int, readers: int, write: Callable[[], None], version: int) -> bool:
        """If ``slot`` is the master and has exactly ``readers`` readers (the caller's own pins: its
        replica), run ``write`` on it and number it ``version``, all under :attr:`lock`, so no reader pins
        it half written (a pin waits for the write, as the thread engine's predictions wait for an
        in-place update). Returns whether it wrote; otherwise the caller writes a free slot."""
        with self._holding():
            if int(self._table[_CURRENT]) != slot or int(self._table[1 + self.num_slots + slot]) != readers:
                return False
            write()
            self._table[1 + slot] = version
            return True

    def _unpin(self, slot: int) -> None:
        count = int(self._table[1 + self.num_slots + slot])
        if count <= 0:
            raise ScheduleError(f"stage {self.stage}: slot {slot} unpinned more often than pinned")
        self._table[1 + self.num_slots + slot] = count - 1

    # ------------------------------------------------------------------------------------- reporting
    def nbytes(self) -> int:
        """Bytes of every slot and the buffers: what the shared segments hold (counted once, whichever
        processes map them)."""
        return self._params.nbytes() + self._buffers.nbytes() + int(self.meta.numel()) * 8

    def storages(self) -> list[StorageKey]:
        """Storage keys of every slot, the buffers and the slot table in this process (the segments
        :meth:`nbytes` counts)."""
        return [*self._params.storages(), *self._buffers.storages(), storage_key(self.meta)]

    def regions(self, slot: int) -> list[Tensor]:
        """Slot ``slot``'s parameters as one contiguous 1-D view per dtype (:meth:`FlatTensors.regions`)."""
        return self._params.regions(slot)

    def copy_current(self) -> list[Tensor]:
        """Copies of the master's parameters (snapshots, tests)."""
        slot, _ = self.pin_current()
        try:
            return [p.clone() for p in self.params[slot]]
        finally:
            self.unpin(slot)


def stage_versions(
    initial: Sequence[StageVersion], live_workers: int, lock_factory: Any
) -> list[SharedStageVersions]:
    """Shared slots for every stage of a plan with ``live_workers`` live workers; ``lock_factory()`` makes
    a cross-process lock (two per stage)."""
    p = len(initial)
    return [
        SharedStageVersions(v, slots_needed(live_workers, p, v.stage), lock_factory(), lock_factory())
        for v in initial
    ]
