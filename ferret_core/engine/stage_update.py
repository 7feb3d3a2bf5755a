"""How a stage's gradients reach its master: accumulation (T2), compensation and the update U (DESIGN §3.13).

:class:`StageUpdater` owns what an update reads and writes: the optimizer, one compensator per stage,
one lock per stage (every update of a stage, and every gradient kept for it, is serialised by it), the
accumulation buffers and the guard under which the masters are read and written in place. It writes the
new master versions into the pipeline's :class:`~ferret_core.engine.versions.VersionStore`; the pipeline
counts, traces and samples memory around it (:mod:`ferret_core.engine.pipeline`).

* **Accumulation** (T2): right after its B, under stage j's lock, an item's gradient is compensated from
  its own read version to the master as it is *then* (τ = master version − read version, θ_then = its
  stash, θ_now = the master) and added into worker n's one accumulation buffer of stage j; the stash is
  released there. So T2 keeps one gradient buffer instead of c^a gradients and their versions (the saving
  eq. ferret-svre credits T2 with; DESIGN §3.10, ``docs/planner.md``). With c^a = 1 this is exactly
  "compensate at the update". With c^a > 1, master updates that other workers make between an item's B
  and the update that applies it are not compensated: accumulation's own delay, which R_F already
  charges (the j of A_{i,j} in eq. ferret-svre).
* **U**, once worker n's count of accumulated gradients of stage j reaches c^a_{n,j}, still under the
  stage's lock: the OCL algorithm's ``regularise`` shapes the gradient, the optimizer builds new master
  tensors from it, the compensator observes ``θ_new − θ_old`` (not computed for ``none`` and
  ``step-aware``, whose ``observe_update`` ignores it), the master version advances, and worker n's
  replica is refreshed to it. The staleness counted for each applied gradient is the master version at
  the update minus its read version. The new tensors go into storage of a dead version, or — when
  nothing but the store and this update references the old master (``in_place``; see
  :mod:`ferret_core.engine.versions`) — into the old master itself. Accumulated gradients left when a
  stream ends are not applied.
* **Non-finite** gradients never reach the weights: one that holds NaN or ±inf when it is offered, or
  that compensation makes non-finite, is not kept (:meth:`StageUpdater.offer` says so; the pipeline
  counts the item as skipped ``non_finite``).
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ferret_core.compensation import StageCompensator
from ferret_core.engine.memory_meter import StorageKey, storage_keys
from ferret_core.engine.optim import Optimizer
from ferret_core.engine.state import Counters, GradientBuffer
from ferret_core.engine.step_guard import finite_norm
from ferret_core.engine.steps import Algorithm
from ferret_core.engine.versions import StageVersion, VersionStore
from ferret_core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class StageUpdate:
    """What one U did: the master version it read and the one it wrote, the staleness of each gradient it
    applied, and whether every storage the memory meter's stable sources hold is the one they held before
    (an in-place update of a stateless optimizer, with replicas sharing the master: their cached keys stay
    right)."""

    read: int
    written: int
    stalenesses: list[int]
    same_storages: bool


class StageUpdater:
    """The optimizer, compensators, stage locks and accumulation buffers of one pipeline, and the writer of
    its masters (see the module docstring). ``in_place``: whether an update may overwrite an unshared master
    (the wall clock turns it off on CUDA); ``state_changed``: called when a compensator allocated state (the
    memory meter re-counts it); ``counters``: the pipeline's, where in-place updates are counted."""

    def __init__(
        self,
        store: VersionStore,
        optimizer: Optimizer,
        compensators: Sequence[StageCompensator],
        algorithm: Algorithm,
        counters: Counters,
        *,
        in_place: bool,
        state_changed: Callable[[], None],
    ) -> None:
        self.store = store
        self.optimizer = optimizer
        self.compensators = tuple(compensators)
        self.algorithm = algorithm
        self.counters = counters
        self.in_place = in_place  # may overwrite an unshared master in place (see apply)
        self._state_changed = state_changed
        self._observes = tuple(c.needs_deltas for c in compensators)
        self._generations = [c.state_generation for c in compensators]
        self.locks = tuple(threading.Lock() for _ in compensators)  # one per stage: its updates, in order
        # held while taking references to the masters (predictions, snapshots, the algorithm's view) and
        # while an update decides to write in place and writes: no reader sees a half-written master
        self._masters_guard = threading.Lock()
        self._buffers = [[GradientBuffer() for _ in compensators] for _ in range(counters.num_workers)]

    def masters(self) -> tuple[StageVersion, ...]:
        """The current master version of every stage, for a reader on any thread (predictions, snapshots):
        holding them keeps them from being overwritten in place (:meth:`apply`), and they are never taken
        while an in-place write is under way."""
        with self._masters_guard:
            return self.store.masters()

    # ---------------------------------------------------------------------------------- accumulation
    def offer(self, worker: int, stage: int, grads: Sequence[Tensor], version: StageVersion) -> bool:
        """Keep one item's parameter gradients of ``stage``, read from ``version`` (:meth:`keep`), when they
        are finite; False when they were not kept (non-finite, or made so by compensation): they never reach
        the weights. Every path that hands a gradient to an update goes through this (call under the stage's
        lock). The check measures the gradient's norm on the way (:func:`finite_norm`, one pass), which the
        norm guard reuses when this gradient alone makes the update."""
        norm = finite_norm(grads)
        return norm is not None and self.keep(worker, stage, grads, version, norm)

    def keep(
        self, worker: int, stage: int, grads: Sequence[Tensor], version: StageVersion, norm: float | None = None
    ) -> bool:
        """Compensate one item's parameter gradients of ``stage`` and add them to the worker's buffer (T2:
        one buffer, the stash released; call under the stage's lock), with their 2-norm ``norm`` where the
        caller measured it. False (nothing added) when the compensated gradient is not finite."""
        fixed = self.compensate(stage, grads, version)
        unchanged = len(fixed) == len(grads) and all(f is g for f, g in zip(fixed, grads, strict=True))
        if not unchanged and not all_finite(fixed):  # the caller checked ``grads`` (τ = 0 returns them)
            return False
        self._buffers[worker][stage].add(fixed, version.version, norm if unchanged else None)
        return True

    def compensate(self, stage: int, grads: Sequence[Tensor], version: StageVersion) -> list[Tensor]:
        """``grads`` (read from ``version``) compensated to the current master (call under the stage's lock)."""
        master = self.store.master(stage)
        compensator = self.compensators[stage]
        fixed = compensator.compensate(
            list(grads), staleness=master.version - version.version, theta_then=version.params, theta_now=master.params
        )
        if compensator.state_generation != self._generations[stage]:  # it allocated state: re-count it
            self._generations[stage] = compensator.state_generation
            self._state_changed()
        return fixed

    def accumulated(self, worker: int, stage: int) -> int:
        """How many gradients worker ``worker``'s buffer of ``stage`` holds (only executor (worker, stage)
        touches that buffer, so the count needs no lock)."""
        return self._buffers[worker][stage].count

    def pending_steps(self, stage: int) -> int:
        """Steps whose gradients of ``stage`` are kept and not yet applied (what a stream's end leaves)."""
        return sum(row[stage].count for row in self._buffers)

    # ---------------------------------------------------------------------------------------- update
    def update(self, worker: int, stage: int) -> StageUpdate:
        """U: apply worker ``worker``'s buffer of ``stage`` to the master and refresh the worker's replica
        (call under the stage's lock)."""
        n, j = worker, stage
        norm = self._buffers[n][j].norm
        grads, reads = self._buffers[n][j].take()
        read = self.store.master(j).version
        in_place_before = self.counters.in_place_updates
        new_params = self.apply(n, j, grads, len(reads), norm)
        del grads
        # an in-place update of a stateless optimizer, with replicas sharing the master, keeps every storage
        # the stable sources hold (same data_ptr and size): their cached keys stay right
        same_storages = (
            self.counters.in_place_updates != in_place_before
            and not self.store.clones_replicas
            and next(iter(self.optimizer.state_tensors()), None) is None
        )
        written = self.store.publish(j, new_params).version
        del new_params
        self.store.refresh(n, j)
        return StageUpdate(read, written, [read - r for r in reads], same_storages)

    def apply(
        self, worker: int, stage: int, total: list[Tensor], steps: int = 1, grad_norm: float | None = None
    ) -> list[Tensor]:
        """Step the optimizer with the accumulated gradient of ``steps`` steps, after the OCL algorithm's
        ``regularise`` (which scales a penalty by ``steps``): the new master tensors (a function, so no
        temporary outlives it; the caller publishes them). ``grad_norm``: ``total``'s 2-norm where it was
        measured, handed to the optimizer's norm guard while ``regularise`` leaves the gradient as it is."""
        master = self.store.master(stage)
        compensator = self.compensators[stage]
        regularised = self.algorithm.regularise(stage, master.params, total, steps)
        if regularised is not total:
            grad_norm = None
        total = regularised
        observes = self._observes[stage]
        if self.in_place and not observes:
            # decided and written under the masters' guard: a reader on another thread (the wall clock's
            # predictions) either took the master before (its reference makes it shared: out of place) or
            # takes it after the write
            with self._masters_guard:
                if self._unshared(master, worker):
                    self.counters.in_place_updates += 1
                    return self.optimizer.step(
                        stage, master.params, total, out=self.store.reuse(master), grad_norm=grad_norm
                    )
        new_params = self.optimizer.step(
            stage, master.params, total, out=self.store.recycled(stage), grad_norm=grad_norm
        )
        if observes:
            with torch.no_grad():
                compensator.observe_update([new - old for new, old in zip(new_params, master.params, strict=True)])
        return new_params

    def _unshared(self, master: StageVersion, worker: int) -> bool:
        """Whether nothing but the master slot, ``worker``'s own replica slot (refreshed right after) and
        the caller's local references ``master``: then no other replica, stash, pending gradient, running
        prediction or outside holder will read it again, and the update may overwrite it in place
        (copy-on-write decided by CPython reference counts)."""
        own = 1 + (self.store.replica(worker, master.stage) is master)
        if self.store.slots_holding(master) != own:
            return False
        # references: those slots, the caller's local, this frame's argument, getrefcount's argument
        return sys.getrefcount(master) == own + 3

    # ----------------------------------------------------------------------------- compensator state
    def compensator_states(self) -> list[dict[str, Any]]:
        """Each stage compensator's ``state_dict()`` (tensors are copies), in stage order; taken under the
        stage locks, so no update is half applied."""
        states = []
        for lock, compensator in zip(self.locks, self.compensators, strict=True):
            with lock:
                states.append(compensator.state_dict())
        return states

    def load_compensator_states(self, states: Sequence[Mapping[str, Any]]) -> None:
        """Restore :meth:`compensator_states` (one per stage, same compensator, shapes and ring capacities)."""
        if len(states) != len(self.compensators):
            raise ConfigError(f"need one compensator state per stage ({len(self.compensators)}), got {len(states)}")
        for lock, compensator, state in zip(self.locks, self.compensators, states, strict=True):
            with lock:
                compensator.load_state_dict(state)

    # ---------------------------------------------------------------------------- memory measurement
    def pending_storages(self) -> Iterator[StorageKey]:
        """The storages of the gradients kept and not yet applied (the meter's ``pending_gradients``)."""
        for row in self._buffers:
            for buffer in row:
                yield from storage_keys(buffer.tensors())


def all_finite(tensors: Sequence[Tensor]) -> bool:
    """Whether no tensor holds NaN or ±inf.

    Fast path, exact when it answers: one ``sum`` per tensor (the cheapest full reduction), their sum read
    once. A finite total proves every element finite (a NaN makes every sum NaN, ±inf makes it ±inf or
    NaN); only a non-finite total, from a non-finite element or from finite values overflowing float32,
    takes the exact check (:func:`_all_finite_exact`). The fast path is 1.5–3× cheaper per call than the
    exact check alone on the MLP's 6 small tensors and MNISTNet's 1.2 M values (``benchmarks/engine``
    (j)), with the same answer (``tests/unit/test_engine_non_finite.py``)."""
    sums = [t.sum() for t in tensors if t.numel()]
    if not sums:
        return True
    if len({(s.dtype, s.device) for s in sums}) > 1:  # one stack needs one dtype and device
        sums = [s.to("cpu", torch.float64) for s in sums]
    if math.isfinite(float(torch.stack(sums).sum())):
        return True
    return _all_finite_exact(tensors)


def _all_finite_exact(tensors: Sequence[Tensor]) -> bool:
    """Whether no tensor holds NaN or ±inf: one ``aminmax`` pass over each (NaN propagates to both ends,
    ±inf is an end), then one check of the 2 ends per tensor. ``isfinite(t).all()`` allocated a bool
    tensor of t's size and took 3.1 ms per call on MNISTNet's 1.2 M gradients (two calls per item: 9 of
    the live trainer's 17 ms per item, ``benchmarks/engine/results/service_time-before.md``); this takes
    0.2 ms."""
    ends = [torch.stack(torch.aminmax(t)) for t in tensors if t.numel()]
    return not ends or bool(torch.isfinite(torch.cat(ends)).all())
