"""One stage's compensator tuning state in shared memory: what every executor of the stage learns from.

Some compensators learn from the gradients they are given, not from the master's updates: Iter-Fisher
tunes λ by gradient descent on EMAs v_r and v_a of the stale gradients (Alg. 1 lines 3–7, ``iter-fisher``,
``iter-fisher-cf``, ``iter-fisher-lean``), DC-ASGD-a keeps a running mean square of every gradient
(``dc-asgd-a``). The paper tunes λ **per stage** (DESIGN §3.3), and the thread engine keeps one
compensator per stage, so every worker's gradient moves that stage's λ and EMAs. On executor processes
each executor builds its own compensator; with state of its own, a worker's λ would learn from a 1/N
share of the stage's gradients and N workers would apply N different λ to the same stage. So that state
lives where every executor of the stage sees it: a :class:`SharedTuning` holds the compensator's
:meth:`~ferret_core.compensation.base.StageCompensator.tuning_state` (λ, the EMAs or the mean square, and
their host-side counts) in one shared flat buffer per dtype (:class:`~ferret_core.engine.processes.slots.FlatTensors`),
and each executor's compensator works on it through
:meth:`~ferret_core.compensation.base.StageCompensator.share_tuning_state`.

Ownership: a compensating executor reads and updates the state inside its compensator's call, which runs
under the stage's update lock (:attr:`SharedStageVersions.update_lock`), so calls from the stage's
executors are serialised as the thread engine serialises them, and the same code runs on either storage:
the same sequence of gradients gives the same λ, EMAs and compensated gradients. What stays per executor
is statistics (calls, the correction's running sum), which the clock's report sums or lists per executor.

Lifetime: built from a prototype compensator of the stage (its initial values: λ⁰, zeros) the first time an
executor of the stage is spawned with such state, on the host that owns the stage; kept through re-plans on
the same clock (an executor a re-plan starts learns on from the stage's λ); a new clock starts from λ⁰
again, as a new thread engine does, unless its owner loads a state into it
(:meth:`ProcessClock.load_compensator_states`: the trainer carries it on to the new clock of a re-plan or a
recovery, and loads a snapshot's). Counted once (:meth:`ProcessClock.shared_bytes`; executors' memory meters
exclude it; the byte model: ``ferret_core/planning/memory_model.py`` "Executor processes").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.memory_meter import StorageKey
from ferret_core.engine.processes.slots import FlatTensors


class SharedTuning:
    """A stage compensator's tuning state in shared memory, with the values of ``prototype`` (a
    compensator's :meth:`tuning_state`). Picklable to a child process started by a ``torch.multiprocessing``
    context (one shared-memory handle per dtype); the views are rebuilt in each process."""

    def __init__(self, stage: int, prototype: Sequence[Tensor]) -> None:
        self.stage = stage
        self._state = FlatTensors(prototype, 1)
        for shared, value in zip(self._state.views()[0], prototype, strict=True):
            shared.copy_(value.detach())

    def tensors(self) -> list[Tensor]:
        """The state, in the prototype's order (views of the shared buffers, cached per process). Read and
        update it under the stage's update lock."""
        return list(self._state.views()[0])

    def nbytes(self) -> int:
        """Bytes of the state (counted once, whichever processes map it)."""
        return self._state.nbytes()

    def storages(self) -> list[StorageKey]:
        """Storage keys of the state in this process (what an executor's memory meter excludes: the
        coordinator counts it once)."""
        return self._state.storages()


class StageTunings:
    """The shared tuning states of the stages one process holds (the coordinator's local stages, or a host's
    own), each built the first time an executor of its stage keeps one and kept for the clock's life."""

    def __init__(self) -> None:
        self._by_stage: dict[int, SharedTuning] = {}

    def get(
        self, stage: int, params: Sequence[Tensor], compensator: str, settings: CompensatorSettings, ring_capacity: int
    ) -> SharedTuning | None:
        """``stage``'s shared tuning state for ``compensator`` built with ``ring_capacity`` (the stage's
        staleness bound, as its executors build theirs) over ``params``; None where it learns nothing from
        gradients there (no state to share)."""
        tuning = self._by_stage.get(stage)
        if tuning is None and make_compensator(compensator, [torch.zeros(1)], settings, ring_capacity).tuning_state():
            prototype = make_compensator(compensator, params, settings, ring_capacity).tuning_state()
            tuning = self._by_stage[stage] = SharedTuning(stage, prototype)
        return tuning

    def __getitem__(self, stage: int) -> SharedTuning:
        return self._by_stage[stage]

    def __contains__(self, stage: object) -> bool:
        return stage in self._by_stage

    def nbytes(self) -> int:
        """Bytes of every state held (each counted once)."""
        return sum(t.nbytes() for t in self._by_stage.values())
