"""A control call whose client deadline passed before it could act is not applied (issue 26, item 5): no
budget change, no snapshot written or restored, and the caller gets DEADLINE_EXCEEDED. Real gRPC on port 0,
the real re-planner and the real loop hand-over (:class:`LoopCalls`), with the trainer loop held busy."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from ferret_core.plan import Plan
from services.control.client import ControlCallError, ControlClient
from services.control.deadline import CallDeadline
from services.control.errors import DeadlineExpired
from services.control.replanner import Replanner
from services.control.server import ControlServer, create_server
from services.control.trainer_port import AppliedPlan, SnapshotInfo
from services.trainer.loop_calls import LoopCalls

from .control_fakes import FULL_BYTES, MIN_BYTES, PLANNER, FakeTrainer, GatedPlanner

MID_BYTES = (MIN_BYTES + FULL_BYTES) // 2
CLIENT_DEADLINE_S = 0.3


class BusyLoop:
    """The trainer's loop thread: bound to ``calls``, it runs queued calls only once ``free`` is set (until
    then it is "in a long batch"), and again every few milliseconds until stopped."""

    def __init__(self, calls: LoopCalls) -> None:
        self.calls = calls
        self.free = threading.Event()
        self._stop = threading.Event()
        bound = threading.Event()

        def run() -> None:
            calls.bind()
            bound.set()
            self.free.wait(30)
            while not self._stop.wait(0.005):
                calls.serve(_no_pause)

        self.thread = threading.Thread(target=run, name="busy-loop", daemon=True)
        self.thread.start()
        assert bound.wait(5)

    def stop(self) -> None:
        self.free.set()
        self._stop.set()
        self.thread.join(5)
        self.calls.close()


class _NoPause:
    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...


def _no_pause() -> _NoPause:
    return _NoPause()


class LoopTrainer(FakeTrainer):
    """The fake trainer with its changes run on the loop thread, as :class:`services.trainer.service.Trainer`
    runs them: through ``LoopCalls.call(fn, deadline=...)``."""

    def __init__(self, plan: Plan, calls: LoopCalls) -> None:
        super().__init__(plan)
        self.calls = calls

    def apply_plan(self, plan: Plan, version: int, deadline: CallDeadline | None = None) -> AppliedPlan:
        return self.calls.call(lambda: super(LoopTrainer, self).apply_plan(plan, version), deadline=deadline)

    def save_snapshot(self, metadata: Mapping[str, str], deadline: CallDeadline | None = None) -> SnapshotInfo:
        return self.calls.call(lambda: super(LoopTrainer, self).save_snapshot(metadata), deadline=deadline)

    def restore_snapshot(self, version: int | None, deadline: CallDeadline | None = None) -> SnapshotInfo:
        return self.calls.call(lambda: super(LoopTrainer, self).restore_snapshot(version), deadline=deadline)


@pytest.fixture
def loop() -> Iterator[BusyLoop]:
    busy = BusyLoop(LoopCalls())
    yield busy
    busy.stop()


@pytest.fixture
def trainer(loop: BusyLoop) -> LoopTrainer:
    return LoopTrainer(PLANNER.plan(None), loop.calls)


@pytest.fixture
def control(trainer: LoopTrainer) -> Iterator[ControlServer]:
    server = create_server(PLANNER, trainer, unary_workers=4).start()
    yield server
    server.stop(grace_s=1.0)


def _expired_while_the_loop_is_busy(control: ControlServer, loop: BusyLoop, call: str, *args: object) -> None:
    """Call ``call`` with a short deadline while the loop is busy, and free the loop only after it passed."""
    with ControlClient(control.target, timeout_s=CLIENT_DEADLINE_S) as client:
        started = time.monotonic()
        with pytest.raises(ControlCallError) as err:
            getattr(client, call)(*args)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started >= CLIENT_DEADLINE_S * 0.9
    loop.free.set()  # the batch ends: the loop now reaches the expired call


def test_a_budget_change_whose_deadline_passed_waiting_for_the_loop_is_not_applied(
    control: ControlServer, loop: BusyLoop, trainer: LoopTrainer
) -> None:
    _expired_while_the_loop_is_busy(control, loop, "set_memory_budget", MID_BYTES)
    with ControlClient(control.target, timeout_s=10) as client:
        # The re-plan worker takes requests in order: once this one returns, the expired one was handled.
        reply = client.set_memory_budget(FULL_BYTES)
    assert reply.plan_version == 2, "the expired request took a plan version"
    assert [(plan.budget_bytes, version) for plan, version in trainer.applied] == [(FULL_BYTES, 2)]


def test_a_snapshot_whose_deadline_passed_waiting_for_the_loop_is_not_written(
    control: ControlServer, loop: BusyLoop, trainer: LoopTrainer
) -> None:
    _expired_while_the_loop_is_busy(control, loop, "save_snapshot", {"reason": "late"})
    with ControlClient(control.target, timeout_s=10) as client:
        saved = client.save_snapshot({"reason": "in time"})  # the loop serves calls in order
        listed = client.list_snapshots()
    assert saved.version == 1 and saved.metadata["reason"] == "in time"
    assert [s.version for s in listed.snapshots] == [1]


def test_a_restore_whose_deadline_passed_waiting_for_the_loop_is_not_applied(
    control: ControlServer, loop: BusyLoop, trainer: LoopTrainer
) -> None:
    loop.free.set()
    with ControlClient(control.target, timeout_s=10) as client:
        client.save_snapshot({})
    calls, busy = loop.calls, threading.Event()
    # hold the loop in a "batch" again: a call that blocks the loop thread until the test lets it go
    with ThreadPoolExecutor(1) as pool:
        holder = pool.submit(calls.call, lambda: busy.wait(30))
        time.sleep(0.05)
        with (
            ControlClient(control.target, timeout_s=CLIENT_DEADLINE_S) as client,
            pytest.raises(ControlCallError) as err,
        ):
            client.restore_snapshot(1)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        busy.set()
        holder.result(5)
    with ControlClient(control.target, timeout_s=10) as client:
        client.save_snapshot({})  # served after the expired restore
    assert trainer.current_plan()[1] == 1, "the expired restore replaced the plan"


def test_the_loop_does_not_run_a_call_whose_deadline_passed_and_runs_the_next() -> None:
    calls = LoopCalls()
    loop = BusyLoop(calls)
    ran: list[str] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            late = pool.submit(calls.call, lambda: ran.append("late"), deadline=CallDeadline.after(0.05), what="late")
            in_time = pool.submit(calls.call, lambda: ran.append("in time"), deadline=CallDeadline.after(30))
            time.sleep(0.15)
            loop.free.set()
            with pytest.raises(DeadlineExpired, match=r"^late was not applied: the caller's deadline passed"):
                late.result(5)
            in_time.result(5)
        assert ran == ["in time"]
    finally:
        loop.stop()
    direct = LoopCalls()  # before the loop starts, calls run at once: the deadline is still checked first
    with pytest.raises(DeadlineExpired):
        direct.call(lambda: ran.append("direct"), deadline=CallDeadline(time.monotonic() - 1))
    assert ran == ["in time"] and direct.call(lambda: 7, deadline=None) == 7


def test_a_replan_whose_deadline_passes_while_planning_is_not_applied() -> None:
    planner = GatedPlanner(PLANNER)
    trainer = FakeTrainer(PLANNER.plan(None))
    replanner = Replanner(planner, trainer)
    entered, release = planner.gate(MID_BYTES)
    try:
        with ThreadPoolExecutor(1) as pool:
            outcome = pool.submit(replanner.request, MID_BYTES, deadline=CallDeadline.after(0.1))
            assert entered.wait(5)
            time.sleep(0.2)
            release.set()
            with pytest.raises(DeadlineExpired, match=rf"re-plan #1 for {MID_BYTES} bytes was not applied"):
                outcome.result(5)
        assert trainer.applied == [] and trainer.current_plan()[1] == 1
        assert replanner.request(MID_BYTES, deadline=CallDeadline.after(30)).version == 2
    finally:
        replanner.close()


def test_deadline_of_a_grpc_context() -> None:
    class Context:
        def __init__(self, remaining: float | None) -> None:
            self.remaining = remaining

        def time_remaining(self) -> float | None:
            return self.remaining

    assert CallDeadline.of(Context(None)) is None
    assert CallDeadline.of(Context(9.2e9)) is None  # what gRPC reports for a call without a deadline
    deadline = CallDeadline.of(Context(2.0))
    assert deadline is not None and 1.5 < deadline.remaining() <= 2.0
    deadline.check("anything")  # not passed: no error
