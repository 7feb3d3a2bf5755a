"""In-memory fakes and fixtures for the control-plane tests: a trainer, a gated planner, a server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from ferret_core.plan import Plan
from ferret_core.planning.planner import Planner, PlannerSettings
from services.control.deadline import CallDeadline
from services.control.errors import SnapshotNotFound
from services.control.trainer_port import AppliedPlan, SnapshotInfo, TrainerState, TrainerStatus

from .planner_fixtures import golden_a


class FakeTrainer:
    """A TrainerPort that keeps everything in memory; ``applied`` records every apply_plan call. Like the
    trainer, it checks a call's deadline right before acting."""

    def __init__(self, plan: Plan, stall_seconds: float = 0.001) -> None:
        self._lock = threading.Lock()
        self._plan = plan
        self._version = 1
        self._stall = stall_seconds
        self._snapshots: dict[int, tuple[SnapshotInfo, Plan]] = {}
        self._status_calls = 0
        self.applied: list[tuple[Plan, int]] = []

    def current_plan(self) -> tuple[Plan, int]:
        with self._lock:
            return self._plan, self._version

    def apply_plan(self, plan: Plan, version: int, deadline: CallDeadline | None = None) -> AppliedPlan:
        if deadline is not None:
            deadline.check(f"plan v{version}")
        with self._lock:
            self._plan, self._version = plan, version
            self.applied.append((plan, version))
            return AppliedPlan(version=version, stall_seconds=self._stall, applied_time_ms=time.time_ns() // 10**6)

    def status(self) -> TrainerStatus:
        with self._lock:
            self._status_calls += 1
            n = self._status_calls * 10
            return TrainerStatus(
                state=TrainerState.RUNNING,
                instance_id="fake-0",
                items_received=n,
                items_valid=n - 1,
                predictions_published=n - 1,
                backward_passes=n // 2,
                skipped={"busy": n // 4, "no_label": 1},
                dead_lettered={"bad_shape": 1},
                labelled_predictions=n - 2,
                correct_predictions=(n - 2) // 2,
                online_accuracy=50.0,  # percent, as the trainer reports it
                budget_bytes=self._plan.budget_bytes,
                planned_bytes=self._plan.planned_bytes,
                measured_bytes=self._plan.planned_bytes - 100,
                lag_items=2,
                latency_ms_p50=1.5,
                latency_ms_p99=4.0,
                plan_version=self._version,
            )

    def save_snapshot(self, metadata: Mapping[str, str], deadline: CallDeadline | None = None) -> SnapshotInfo:
        if deadline is not None:
            deadline.check("the snapshot")
        with self._lock:
            version = len(self._snapshots) + 1
            info = SnapshotInfo(
                version=version,
                instance_id="fake-0",
                created_time_ms=time.time_ns() // 10**6,
                chunks=1,
                total_bytes=1234,
                sha256="ab" * 32,
                plan_version=self._version,
                metadata=dict(metadata),
            )
            self._snapshots[version] = (info, self._plan)
            return info

    def restore_snapshot(self, version: int | None, deadline: CallDeadline | None = None) -> SnapshotInfo:
        if deadline is not None:
            deadline.check("the restore")
        with self._lock:
            if version is None:
                version = max(self._snapshots, default=None)
            if version is None or version not in self._snapshots:
                raise SnapshotNotFound(version)
            info, plan = self._snapshots[version]
            self._plan, self._version = plan, self._version + 1
            return info

    def list_snapshots(self, verify: bool) -> list[SnapshotInfo]:
        with self._lock:
            return [replace(info, seconds=0.0) for info, _ in self._snapshots.values()]


class GatedPlanner:
    """A real Planner whose ``plan(budget)`` blocks, for the budgets given to :meth:`gate`, until the
    test releases it; ``entered`` tells the test the worker thread is planning."""

    def __init__(self, inner: Planner) -> None:
        self.inner = inner
        self._gates: dict[int, tuple[threading.Event, threading.Event]] = {}
        self.calls: list[int | None] = []

    def gate(self, budget: int) -> tuple[threading.Event, threading.Event]:
        entered, release = threading.Event(), threading.Event()
        self._gates[budget] = (entered, release)
        return entered, release

    def plan(self, budget_bytes: int | None = None) -> Plan:
        self.calls.append(budget_bytes)
        gate = self._gates.get(budget_bytes) if budget_bytes is not None else None
        if gate is not None:
            gate[0].set()
            assert gate[1].wait(10), "the test never released the gated plan"
        return self.inner.plan(budget_bytes)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition the code under test exposes no event for (bounded, 5 ms steps)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        pause.wait(0.005)


PLANNER = Planner(golden_a(), PlannerSettings())
MIN_BYTES = PLANNER.min_feasible_bytes  # 24_003_016 for golden case (a)
FULL_BYTES = PLANNER.plan(None).planned_bytes  # 53_654_832
