"""Admission by event time (``ferret_core.engine.admission``): the rule on numbers, the queue's size, the
measured service time, and the wall clock admitting a Kafka batch by its items' event times."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.engine import EngineSettings, FerretPolicy, SkipReason, StreamEngine
from ferret_core.engine.admission import (
    MAX_QUEUE_SLOTS,
    AdmissionSettings,
    EventTimeAdmission,
    ServiceTimes,
    max_wait,
    queue_bytes,
    queue_slots,
)
from ferret_core.errors import ConfigError
from tests.unit.test_engine_support import make_plan, stream, tiny_units


def test_max_wait_is_the_half_life_of_the_data_value() -> None:
    c = 50.0
    assert math.exp(-c * max_wait(c)) == pytest.approx(0.5)
    assert max_wait(0.0) == math.inf
    with pytest.raises(ConfigError):
        max_wait(-1.0)


def test_queue_slots() -> None:
    # one worker, an item every 10 ms: W = 25 ms and D = 100 ms bring 12.5 -> 13 items
    assert queue_slots(0.025, 0.1, 0.01, 1) == 13
    assert queue_slots(0.025, 0.1, 0.01, 2) == 7  # every other item reaches a worker
    assert queue_slots(0.0, 0.0, 0.01, 1) == 1  # at least one
    assert queue_slots(math.inf, 0.1, 0.01, 1) == MAX_QUEUE_SLOTS
    assert queue_bytes(13, 2, 784, 4) == 13 * 2 * 784 * 4
    with pytest.raises(ConfigError):
        queue_slots(0.0, 0.0, 0.0, 1)


def test_items_at_the_workers_pace_are_all_admitted_whenever_they_are_read() -> None:
    rule = EventTimeAdmission(1, max_wait_s=0.0)
    assert all(rule.admit(0, 0.010 * i, 0.009) for i in range(100))  # 10 ms apart, 9 ms each


def test_a_stream_twice_as_fast_as_the_worker_is_trained_every_other_item() -> None:
    rule = EventTimeAdmission(1, max_wait_s=0.001)
    taken = [rule.admit(0, 0.010 * i, 0.019) for i in range(10)]
    assert taken == [True, False] * 5


def test_a_true_burst_is_a_burst() -> None:
    rule = EventTimeAdmission(2, max_wait_s=0.005)
    # ten items stamped at the same instant, two workers (even/odd): each takes one, plus what waits <= 5 ms
    taken = [rule.admit(i % 2, 1.0, 0.004) for i in range(10)]
    assert taken == [True, True, True, True, False, False, False, False, False, False]
    assert rule.wait(0, 1.0) == pytest.approx(0.008)


@given(
    gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=60),
    service=st.floats(0.0, 0.05),
    wait=st.floats(0.0, 0.05),
)
def test_no_admitted_item_waits_longer_than_w(gaps: list[float], service: float, wait: float) -> None:
    """Replaying the rule's own schedule: every admitted item starts within W of its event time and the
    worker never runs two items at once."""
    rule = EventTimeAdmission(1, max_wait_s=wait)
    event, free = 0.0, -math.inf
    for gap in gaps:
        event += gap
        if rule.admit(0, event, service):
            start = max(free, event)
            assert start - event <= wait + 1e-12
            free = start + service


def test_service_times_fold_busy_time_per_item() -> None:
    times = ServiceTimes(1, 2, initial=0.5, window=2, alpha=0.0)
    assert times.service_time(0) == 0.5
    for _ in range(2):  # two items: stage 0 busy 1 + 2 ms each, stage 1 busy 3 + 4 ms each
        times.record(0, 0, 0.001, forward=True)
        times.record(0, 0, 0.002, forward=False)
        times.record(0, 1, 0.003, forward=True)
        times.record(0, 1, 0.004, forward=False)
    # folding happens at the window's forwards: stage 1's second item had its F (3 ms) but not yet its B
    assert times.service_time(0) == pytest.approx((0.003 + 0.004 + 0.003) / 2)


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError):
        AdmissionSettings(max_wait_s=-1.0, queue_slots=1)
    with pytest.raises(ConfigError):
        AdmissionSettings(max_wait_s=0.0, queue_slots=0)


def _clock_outcomes(event_times: list[float] | None, admission: AdmissionSettings) -> list[SkipReason | None]:
    """Items submitted back to back (one Kafka delivery) to a 1-worker, 1-stage engine, then drained."""
    plan = make_plan(1, 1)
    setup = FerretPolicy(plan).setup("tiny", plan.partition.num_units, 1.0)
    engine = StreamEngine(tiny_units(num_units=1), setup, EngineSettings(keep_trace=False, validate=False))
    items = stream(len(event_times or [None] * 12))
    with engine.wall_clock(admission=admission) as clock:
        futures = [
            clock.submit(item.x, item.y, event_time=None if event_times is None else event_times[i])
            for i, item in enumerate(items)
        ]
        outcomes = [f.result(60).skipped for f in futures]
        clock.drain(60)
    return outcomes


def test_the_wall_clock_admits_a_kafka_batch_by_event_time() -> None:
    """Twelve items delivered at once whose event times are 5 s apart (a slow stream that Kafka
    batched) are all trained; stamped at one instant (a real burst) only the first is, whatever the queue."""
    admission = AdmissionSettings(max_wait_s=0.0, queue_slots=64, initial_service_s=0.5)
    assert _clock_outcomes([5.0 * i for i in range(12)], admission) == [None] * 12  # the plan: 3 s per item
    burst = _clock_outcomes([5.0] * 12, admission)
    assert burst[0] is None and burst[1:] == [SkipReason.BUSY] * 11


def test_a_full_queue_makes_an_item_busy_whatever_its_event_time() -> None:
    admission = AdmissionSettings(max_wait_s=math.inf, queue_slots=1, initial_service_s=0.5)
    outcomes = _clock_outcomes([float(i) for i in range(12)], admission)
    assert outcomes[0] is None and SkipReason.BUSY in outcomes  # at most one waits behind the running one
    assert len(outcomes) == 12


def test_without_an_event_time_the_policys_slot_rule_decides() -> None:
    admission = AdmissionSettings(max_wait_s=0.0, queue_slots=64, initial_service_s=0.5)
    outcomes = _clock_outcomes(None, admission)
    assert outcomes[0] is None and SkipReason.BUSY in outcomes  # one waiting slot (Ferret's)
