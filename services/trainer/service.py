"""The trainer's control port: the :class:`~services.control.trainer_port.TrainerPort` the gRPC control
plane calls (DESIGN §4 "gRPC"). Nothing else: the record path is :mod:`.stream`, snapshots are
:mod:`.checkpoints`, the status is :mod:`.status`.

Calls come from gRPC and re-planner threads. Work that touches the learner or the Kafka clients (a re-plan,
a snapshot, a restore) runs on the loop thread through :class:`~services.trainer.loop_calls.LoopCalls`,
between batches, with consumption paused; reads (status, plan, the snapshot list) run where they are called.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future

from ferret_core.plan import Plan
from services.control.deadline import CallDeadline
from services.control.trainer_port import AppliedPlan, SnapshotInfo, TrainerState, TrainerStatus
from services.kafka.record_codec import now_ms
from services.trainer.checkpoints import Checkpoints
from services.trainer.counters import StreamCounters
from services.trainer.learner import Learner
from services.trainer.loop_calls import LoopCalls
from services.trainer.state import Lifecycle, PlanInForce
from services.trainer.status import StatusView
from services.trainer.stream import RecordStream


class Trainer:
    """Implements :class:`services.control.trainer_port.TrainerPort` over the trainer's parts."""

    def __init__(
        self,
        *,
        stream: RecordStream,
        checkpoints: Checkpoints,
        calls: LoopCalls,
        status_view: StatusView,
        learner: Learner,
        plan: PlanInForce,
        lifecycle: Lifecycle,
        counters: StreamCounters,
    ) -> None:
        self._stream = stream
        self._checkpoints = checkpoints
        self._calls = calls
        self._status = status_view
        self._learner = learner
        self._plan = plan
        self._lifecycle = lifecycle
        self._counters = counters

    def current_plan(self) -> tuple[Plan, int]:
        return self._plan.get()

    def apply_plan(self, plan: Plan, version: int, deadline: CallDeadline | None = None) -> AppliedPlan:
        def swap() -> AppliedPlan:
            start = time.monotonic()
            with self._lifecycle.during(TrainerState.REPLANNING):
                self._learner.drain()
                self._learner.apply_plan(plan)
                self._plan.set(self._learner.plan, version)
                self._counters.add("replans")
            return AppliedPlan(version, time.monotonic() - start, now_ms())

        return self._calls.call(swap, deadline=deadline, what=f"plan v{version}")

    def status(self) -> TrainerStatus:
        return self._status.status()

    def save_snapshot(self, metadata: Mapping[str, str], deadline: CallDeadline | None = None) -> SnapshotInfo:
        # drained, flushed and encoded on the loop thread; the Redis write is waited for here, off the loop
        def start() -> Future[SnapshotInfo]:
            return self._checkpoints.start(metadata, self._stream)

        return self._calls.call(start, deadline=deadline, what="the snapshot").result()

    def restore_snapshot(self, version: int | None, deadline: CallDeadline | None = None) -> SnapshotInfo:
        def restore() -> SnapshotInfo:
            restored = self._checkpoints.restore(version)
            self._stream.resume_from(restored.offsets)
            return restored.info

        what = "the restore of the newest snapshot" if version is None else f"the restore of snapshot v{version}"
        return self._calls.call(restore, deadline=deadline, what=what)

    def list_snapshots(self, verify: bool) -> list[SnapshotInfo]:
        return self._checkpoints.list(verify)
