"""One stage's running average of the master's steps in shared memory, for Gap-Aware on executor processes.

Gap-Aware (``gap-aware``, :class:`~ferret_core.compensation.simple.GapAwareCompensator`) divides a stale
gradient by G = max(1, |θ_now − θ_then| / (Ĉ + ε)), where C ← α·C + (1 − α)·|Δθ| is folded on **every**
master update of the stage and Ĉ = C / (1 − α^n) after n of them. On executor processes those updates
come from every worker of the stage, each in its own process, and each executor keeps its own
compensator: a C of its own would fold only its worker's updates (a smaller n, a C from another
sequence) and give another G than the thread engine's. So C and n live where every executor of the stage
sees them: a :class:`SharedStepAverage` holds one tensor per parameter, shaped and typed as the stage's
parameters (one shared flat buffer per dtype, :class:`~ferret_core.engine.processes.slots.FlatTensors`),
and n as one shared int64; each executor's compensator works on them through
:meth:`~ferret_core.compensation.base.StageCompensator.share_average`.

Why this design and not the delta ring Iter-Fisher shares (:mod:`.deltas`): C is a fold, not a window.
Folding the ring's deltas at compensation time would need every delta since the clock started (a ring
that never evicts), or a reader that folds every delta it did not see before eviction (which it cannot
promise: a worker may not compensate for longer than the ring holds). Folding once, where the update is
made, costs one copy of the parameters per stage whatever the staleness bound, and the fold is the
thread engine's own code (``observe_update``), so C, n and the compensated gradients equal
:class:`GapAwareCompensator`'s on the same sequence of updates.

Ownership: the executor that updates the stage's master writes the new version out of place (as the
thread engine does where a compensator observes the update), folds θ_new − θ_old into C and n with its
compensator's ``observe_update`` and then publishes the version, all under the stage's update lock
(:attr:`SharedStageVersions.update_lock`); a compensating executor reads C and n under the same lock. So
n always equals the stage's master version (counted from the clock's start) and a read never sees a
fold half written.

Lifetime: allocated by :meth:`ProcessClock.start` at every stage whose staleness bound is > 0 under the
clock's first plan (as the rings: a stage that is never stale keeps no C), zero with n = 0; kept through
re-plans on the same clock (an executor started by a re-plan shares the C its stage has folded so far);
a new clock starts from C = 0, n = 0 (until its first fold a stale gradient is applied as is, as on a
fresh thread engine), unless its owner loads a state into it (:meth:`ProcessClock.load_compensator_states`:
the trainer carries C and n on to the new clock of a re-plan or a recovery, and loads a snapshot's,
``services/trainer/process_learner.py``). The coordinator counts its
bytes once (:meth:`ProcessClock.shared_bytes`; executors' memory meters exclude them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ferret_core.engine.memory_meter import StorageKey, storage_key
from ferret_core.engine.processes.slots import FlatTensors


class SharedStepAverage:
    """Gap-Aware's C (one tensor per parameter of the stage) and its update count n in shared memory.
    Picklable to a child process started by a ``torch.multiprocessing`` context (one shared-memory handle
    per dtype plus the count); the views are rebuilt in each process."""

    def __init__(self, stage: int, params: Sequence[Tensor]) -> None:
        self.stage = stage
        self._average = FlatTensors(params, 1)  # zeros: C before any update
        self.count = torch.zeros(1, dtype=torch.int64)
        self.count.share_memory_()  # type: ignore[no-untyped-call]

    def tensors(self) -> list[Tensor]:
        """C, one tensor per parameter in the stage's order (views of the shared buffers, cached per
        process). Fold and read them under the stage's update lock."""
        return list(self._average.views()[0])

    @property
    def updates(self) -> int:
        """n: master updates folded so far (the stage's master version, which starts at 0)."""
        return int(self.count[0])

    def nbytes(self) -> int:
        """Bytes of C and n (counted once, whichever processes map them)."""
        return self._average.nbytes() + int(self.count.numel()) * self.count.element_size()

    def storages(self) -> list[StorageKey]:
        """Storage keys of C and n in this process (what an executor's memory meter excludes: the
        coordinator counts them once)."""
        return [*self._average.storages(), storage_key(self.count)]
