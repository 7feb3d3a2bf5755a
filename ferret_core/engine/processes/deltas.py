"""One stage's delta ring in shared memory, for compensators that walk the master's deltas (Alg. 1).

Iter-Fisher (``iter-fisher``, ``iter-fisher-cf``) compensates a gradient τ updates stale with the τ
master deltas θ^{t+k−1} − θ^{t+k−2} since its version (:mod:`ferret_core.compensation.iter_fisher`). On
executor processes those updates come from every worker of the stage, each in its own process, so the
deltas live where every executor of the stage sees them: a :class:`SharedDeltas` holds ``capacity``
delta slots (one shared flat buffer per dtype, :class:`~ferret_core.engine.processes.slots.FlatTensors`)
and the ring's counters (pushed, head, held) in shared memory, and :meth:`SharedDeltas.ring` is a
:class:`~ferret_core.compensation.ring.DeltaRing` over them in each process — the same ring logic and
invariant as on the other clocks: after n pushes it holds the last min(n, capacity) deltas, in push order.

Ownership: the executor that updates the stage's master pushes θ_new − θ_old, and a compensating
executor reads the deltas since its gradient's version (oldest first), both under the stage's update
lock (:attr:`SharedStageVersions.update_lock`), so a read never sees a push half written and ``pushed``
equals the stage's master version. λ, v_r and v_a are shared apart (:mod:`.tuning`).

Capacity is the stage's staleness bound under the plan (:func:`ferret_core.staleness.ring_capacity`),
what the thread engine sizes its rings to before any growth. The process clock does not enforce that
bound (executors run when their inputs are ready, as on the wall clock), and shared memory cannot grow
as the wall clock's rings do (``follow_staleness``), so a gradient staler than the bound is compensated
with the ``capacity`` most recent deltas and counted as truncated (the compensator's ``truncated``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ferret_core.compensation.ring import COUNTERS, DeltaRing
from ferret_core.engine.memory_meter import StorageKey, storage_key
from ferret_core.engine.processes.slots import FlatTensors
from ferret_core.errors import ConfigError


class SharedDeltas:
    """``capacity`` deltas of one stage's parameters in shared memory, and the ring's counters. Picklable
    to a child process started by a ``torch.multiprocessing`` context (one shared-memory handle per dtype
    plus the counters); :meth:`ring` is built once per process over the same memory."""

    def __init__(self, stage: int, params: Sequence[Tensor], capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(
                f"stage {stage}: a shared delta ring holds >= 1 delta (the stage's staleness bound), got "
                f"{capacity!r}; a stage whose bound is 0 needs none"
            )
        self.stage = stage
        self.capacity = capacity
        self._slots = FlatTensors(params, capacity)
        self.counters = torch.zeros(COUNTERS, dtype=torch.int64)
        self.counters.share_memory_()  # type: ignore[no-untyped-call]

    def ring(self) -> DeltaRing:
        """The ring over the shared slots and counters (cached per process). Push and read it under the
        stage's update lock."""
        ring = self.__dict__.get("_ring")
        if ring is None:
            ring = self.__dict__["_ring"] = DeltaRing(
                self.capacity, slots=self._slots.views(), counters=self.counters
            )
        return ring

    @property
    def pushed(self) -> int:
        """Master updates pushed so far (the stage's master version, which starts at 0)."""
        return self.ring().pushed

    def nbytes(self) -> int:
        """Bytes of the delta slots and the counters (counted once, whichever processes map them)."""
        return self._slots.nbytes() + int(self.counters.numel()) * self.counters.element_size()

    def storages(self) -> list[StorageKey]:
        """Storage keys of the delta slots and the counters in this process (what an executor's memory
        meter excludes: the coordinator counts them once)."""
        return [*self._slots.storages(), storage_key(self.counters)]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_ring", None)
        return state
