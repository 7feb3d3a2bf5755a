"""Snapshots never hold the record path for Redis (services/trainer/snapshot_writes.py): with a store whose
Redis can be frozen, a periodic snapshot returns at once, readiness stays SERVING while ``ferret.snapshots``
reports the hung write after ``redis.stall_s``, no second write starts meanwhile, the reconnect ping runs
off the loop, and a snapshot that really holds the record path (a slow drain) shows in readiness. The
reliability tier freezes a real Valkey under a running trainer (tests/reliability/test_trainer_faults.py)."""

from __future__ import annotations

import threading
import time

import redis

from services.control.health import ControlHealth
from services.kafka.record_codec import SampleDecoder
from services.snapshots import (
    Backoff,
    PreparedSnapshot,
    Reconnect,
    SnapshotManifest,
    SnapshotPayload,
    SnapshotUnavailableError,
    SnapshotWriteError,
)
from services.trainer.checkpoints import Checkpoints
from services.trainer.runner import TrainerParts, assemble
from services.trainer.snapshot_writes import WriteQueue, stuck_after
from tests.unit.test_trainer_stream import SETTINGS, TOPICS, ScriptedLearner

STALL_S = 0.2
TIMEOUT_S = 1.0  # the fake Redis's socket timeout: a command on a frozen Redis fails after it


class FrozenStore:
    """A snapshot store whose Redis can be frozen (SIGSTOP): a command then blocks until it is thawed or
    :data:`TIMEOUT_S` passed, and fails as redis-py's socket timeout makes the real store fail."""

    def __init__(self) -> None:
        self.thawed = threading.Event()
        self.thawed.set()
        self.written: list[PreparedSnapshot] = []
        self.pings = 0
        self.ping_threads: list[threading.Thread] = []

    def _command(self, what: str) -> None:
        if not self.thawed.wait(TIMEOUT_S):
            raise SnapshotWriteError(f"{what}: Timeout reading from socket") from redis.TimeoutError("Timeout")

    def prepare(self, payload: SnapshotPayload) -> PreparedSnapshot:
        return PreparedSnapshot(payload, (), (), 0, "", {})

    def write(self, prepared: PreparedSnapshot) -> SnapshotManifest:
        self._command("write")
        self.written.append(prepared)
        p = prepared.payload
        return SnapshotManifest(len(self.written), "r0", 0, (), 0, "", {}, p.plan, p.offsets, p.counters, {}, p.meta)

    def prune(self, keep: int) -> None:
        self._command("prune")

    def ping(self) -> None:
        self.pings += 1
        self.ping_threads.append(threading.current_thread())
        if not self.thawed.wait(TIMEOUT_S):
            raise SnapshotUnavailableError("ping: Timeout reading from socket")


def checkpoints_for(
    store: FrozenStore, health: ControlHealth, learner: ScriptedLearner | None = None
) -> tuple[Checkpoints, TrainerParts, Reconnect]:
    learner = learner or ScriptedLearner()
    parts = assemble(SETTINGS, learner, SampleDecoder((1, 8, 8), 10), None)  # type: ignore[arg-type]
    link = Reconnect(store.ping, backoff=Backoff(initial_s=0.05, max_s=0.1), on_change=health.set_snapshots_ok)
    checkpoints = Checkpoints(
        store=store,  # type: ignore[arg-type]
        learner=learner,  # type: ignore[arg-type]
        plan=parts.checkpoints.plan,
        counters=parts.counters,
        ledger=parts.checkpoints.ledger,
        lifecycle=parts.checkpoints.lifecycle,
        samples_topic=TOPICS.samples,
        instance_id="r0",
        keep=3,
        interval_s=0.05,
        on_health=health.set_snapshots_ok,
        link=link,
        stall_guard=health.readiness_deadline,
        stall_s=STALL_S,
    )
    return checkpoints, parts, link


def wait_until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def test_a_frozen_redis_never_holds_the_loop_and_health_reports_the_hung_write() -> None:
    store, health = FrozenStore(), ControlHealth(ready=True)
    checkpoints, parts, link = checkpoints_for(store, health)
    assert link.check()  # start-up's check, on this thread
    store.ping_threads.clear()
    store.thawed.clear()  # SIGSTOP
    time.sleep(0.06)
    assert checkpoints.due()
    began = time.monotonic()
    checkpoints.save_periodic(parts.stream)
    held_s = time.monotonic() - began
    assert held_s < STALL_S, f"the loop waited {held_s:.3f} s for a frozen Redis"
    assert health.snapshots_ok  # not yet: the write has hung less than stall_s
    time.sleep(STALL_S + 0.1)
    assert not health.snapshots_ok and health.ready  # the hung write shows; the stream is not held
    assert not checkpoints.due()  # one write at a time on a hung Redis
    wait_until(lambda: not link.available, TIMEOUT_S + 2)  # the write timed out...
    assert not link.available and not health.snapshots_ok  # ...degraded until a ping answers
    assert checkpoints.last_version == 0 and store.written == []
    began = time.monotonic()
    while time.monotonic() - began < 0.3:  # the loop keeps asking while the ping hangs off it
        asked = time.monotonic()
        assert not checkpoints.due()
        assert time.monotonic() - asked < 0.05
        time.sleep(0.01)
    assert store.ping_threads and threading.current_thread() not in store.ping_threads  # pinged, off the loop
    store.thawed.set()  # SIGCONT
    wait_until(lambda: link.available and checkpoints.due())
    checkpoints.save_periodic(parts.stream)
    wait_until(lambda: checkpoints.last_version == 1)
    assert health.snapshots_ok and health.ready


def test_a_snapshot_that_holds_the_record_path_longer_than_stall_s_shows_in_readiness() -> None:
    class SlowDrain(ScriptedLearner):
        def drain(self, timeout: float | None = None) -> None:
            time.sleep(STALL_S * 3)

    store, health = FrozenStore(), ControlHealth(ready=True)
    checkpoints, parts, _ = checkpoints_for(store, health, SlowDrain())
    seen: list[bool] = []
    saving = threading.Thread(target=lambda: checkpoints.save({}, parts.stream))
    saving.start()
    while saving.is_alive():
        seen.append(health.ready)
        time.sleep(0.01)
    assert False in seen and health.ready  # NOT_SERVING while the drain held the stream, SERVING after
    assert checkpoints.last_version == 1


def test_the_write_queue_runs_jobs_in_order_off_the_caller() -> None:
    queue, ran = WriteQueue(), []
    release = threading.Event()
    first = queue.submit(lambda: release.wait(5) and ran.append(threading.current_thread()))
    second = queue.submit(lambda: ran.append("second") or 2)
    assert queue.busy and not first.done()
    release.set()
    assert second.result(5) == 2 and ran[-1] == "second" and ran[0] is not threading.current_thread()
    assert not queue.busy
    fired: list[str] = []
    with stuck_after(0.05, lambda: fired.append("stuck")):
        time.sleep(0.15)
    with stuck_after(0.05, lambda: fired.append("late")):
        pass
    time.sleep(0.1)
    assert fired == ["stuck"]
