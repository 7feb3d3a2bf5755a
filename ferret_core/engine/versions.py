"""Model versions: one master per stage, one working replica per (worker, stage), stashes (DESIGN §3.13).

A :class:`StageVersion` is an immutable snapshot of one stage's parameters and buffers, numbered by the
master version it was taken from (master version = number of updates of that stage so far). Nothing
ever writes into a version's tensors: an update builds *new* tensors (out of place) and publishes them
as the next master version, so a graph that saved a version's weights stays valid (DESIGN §2, "PyTorch
mechanics").

* The **master** of stage j predicts and receives every worker's updates of stage j.
* Worker n's **replica** of stage j is the version its forwards read. It changes only at worker n's own
  update points of stage j (:meth:`VersionStore.refresh`), where it becomes the new master version.
* A **stash** is an old replica still referenced by in-flight items that read it at their forward; it
  lives exactly as long as they do (Python reference counting), and then its memory is freed.

Replica copies. Because versions are immutable, "copy the master into a fresh replica" shares the
master's storage by default (``clone_replicas=False``): the replica equals the master in value and stays
that value when the master moves on. Memory is then what really differs — distinct versions alive —
which the engine measures. ``clone_replicas=True`` makes physical copies (what a deployment with one
memory per worker holds, and what eq. ferret-svre counts).

Recycling. Allocating a stage's worth of fresh memory at every update is slow on CPU (the pages of a
large tensor are faulted in anew each time). When a master version dies — no replica, stash, pending
gradient or running prediction references it — its parameter storage goes to a one-deep free list of
its stage, and the next update writes into it (:meth:`VersionStore.recycled`). This is an allocator
cache: the storage belongs to no live tensor, so the memory meter does not count it (as
``torch.cuda.max_memory_allocated`` does not count PyTorch's CUDA cache). It is safe because nothing in
the engine keeps a version's tensors without keeping the version: graphs that saved its weights are
freed before the item releases its stash, and :meth:`Pipeline.master_state` hands out copies.
Better still, when the master being replaced is referenced by nothing but the store's own slots (one
worker, or every other worker's replica already newer, and no stash or pending gradient reads it), the
update writes into it in place (:meth:`VersionStore.reuse`): plain SGD's memory traffic, bit-identical
results. The pipeline decides this from CPython reference counts, under a guard that readers on other
threads (the wall clock's predictions) take their references under (:meth:`Pipeline.masters`).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ferret_core.engine.memory_meter import StorageKey, storage_key
from ferret_core.errors import ConfigError, ScheduleError


@dataclass(frozen=True, eq=False, slots=True, weakref_slot=True)
class StageVersion:
    """Immutable tensors of one stage at master version ``version`` (params, then buffers, in the
    stage layout's name order). ``storages`` caches their storage keys for the memory meter."""

    stage: int
    version: int
    params: tuple[Tensor, ...]
    buffers: tuple[Tensor, ...]
    storages: tuple[StorageKey, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "storages", tuple(storage_key(t) for t in self.tensors()))

    def tensors(self) -> Iterator[Tensor]:
        yield from self.params
        yield from self.buffers

    def clone(self) -> StageVersion:
        return StageVersion(
            self.stage,
            self.version,
            tuple(p.clone() for p in self.params),
            tuple(b.clone() for b in self.buffers),
        )


class VersionStore:
    """Master versions per stage and replicas per (worker, stage).

    Not synchronised: the engine publishes a stage's master under that stage's update lock and reads
    references (atomic in CPython) elsewhere.
    """

    def __init__(
        self,
        initial: Sequence[StageVersion],
        num_workers: int,
        *,
        clone_replicas: bool = False,
        live: Sequence[bool] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ConfigError(f"a version store needs at least one worker, got {num_workers}")
        if live is not None and len(live) != num_workers:
            raise ConfigError(f"live needs one flag per worker ({num_workers}), got {len(live)}")
        for j, version in enumerate(initial):
            if version.stage != j or version.version != 0:
                raise ConfigError(f"initial versions must be stage j at version 0 in order; got {version}")
        self._clone = clone_replicas
        self._free: list[deque[tuple[Tensor, ...]]] = [deque(maxlen=1) for _ in initial]
        self._finalisers: weakref.WeakKeyDictionary[StageVersion, weakref.finalize[Any, Any]] = (
            weakref.WeakKeyDictionary()
        )
        for version in initial:
            self._recycle_when_dead(version)
        self._master: list[StageVersion] = list(initial)
        # a removed worker (T4) keeps no replica: one would pin version 0 for the whole run
        self._replicas: list[list[StageVersion] | None] = [
            [self._fresh(v) for v in self._master] if live is None or live[n] else None for n in range(num_workers)
        ]

    @property
    def num_stages(self) -> int:
        return len(self._master)

    def master(self, stage: int) -> StageVersion:
        return self._master[stage]

    def masters(self) -> tuple[StageVersion, ...]:
        return tuple(self._master)

    def replica(self, worker: int, stage: int) -> StageVersion:
        return self._row(worker)[stage]

    def _row(self, worker: int) -> list[StageVersion]:
        row = self._replicas[worker]
        if row is None:
            raise ScheduleError(
                f"worker {worker} was removed (T4): expected a live worker's replica, got a request for a "
                "removed one; only live workers run actions (a bug)"
            )
        return row

    def publish(self, stage: int, params: Sequence[Tensor]) -> StageVersion:
        """Make ``params`` (new tensors) the next master version of ``stage``; buffers carry over."""
        old = self._master[stage]
        if len(params) != len(old.params):
            raise ScheduleError(f"stage {stage}: expected {len(old.params)} parameter tensors, got {len(params)}")
        new = StageVersion(stage, old.version + 1, tuple(params), old.buffers)
        self._recycle_when_dead(new)
        self._master[stage] = new
        return new

    def reuse(self, version: StageVersion) -> tuple[Tensor, ...]:
        """Hand ``version``'s parameter storage to the update that replaces it (the caller established
        that nothing else will read the version); it will not be recycled when the version dies."""
        finaliser = self._finalisers.pop(version, None)
        if finaliser is not None:
            finaliser.detach()
        return version.params

    def slots_holding(self, version: StageVersion) -> int:
        """How many of the store's master and replica slots reference ``version``."""
        return sum(v is version for v in self._master) + sum(
            v is version for row in self._replicas if row is not None for v in row
        )

    def recycled(self, stage: int) -> tuple[Tensor, ...] | None:
        """Parameter storage of a dead master version of ``stage`` to write the next one into, if any."""
        try:
            return self._free[stage].popleft()
        except IndexError:
            return None

    def refresh(self, worker: int, stage: int) -> StageVersion:
        """Worker ``worker``'s update point of ``stage``: its replica becomes the current master."""
        replica = self._fresh(self._master[stage])
        self._row(worker)[stage] = replica
        return replica

    def version_ids(self) -> set[int]:
        """``id`` of every master and replica (the versions :meth:`held` counts)."""
        return {id(v) for v in (*self._master, *(v for row in self._replicas if row is not None for v in row))}

    def held(self) -> Iterator[StorageKey]:
        """Storages of the masters and replicas (stashes are held by in-flight items)."""
        seen: set[int] = set()
        for version in (*self._master, *(v for row in self._replicas if row is not None for v in row)):
            if id(version) not in seen:
                seen.add(id(version))
                yield from version.storages

    def _recycle_when_dead(self, version: StageVersion) -> None:
        # deque.append is atomic, so the finaliser may run in any thread, even inside another call here
        finaliser = weakref.finalize(version, self._free[version.stage].append, version.params)
        finaliser.atexit = False
        self._finalisers[version] = finaliser

    @property
    def clones_replicas(self) -> bool:
        """Whether replicas are physical copies (``clone_replicas``): a refresh then allocates."""
        return self._clone

    def _fresh(self, version: StageVersion) -> StageVersion:
        return version.clone() if self._clone else version


def to_device(version: StageVersion, device: torch.device) -> StageVersion:
    """The same version on ``device`` (a no-op when it is already there)."""
    if all(t.device == device for t in version.tensors()):
        return version
    return StageVersion(
        version.stage,
        version.version,
        tuple(p.to(device) for p in version.params),
        tuple(b.to(device) for b in version.buffers),
    )
