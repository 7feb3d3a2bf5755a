"""Admission by event time (``ferret_core.engine.admission``): the rule on numbers, the queue's size, the
measured service time, and the wall clock admitting a Kafka batch by its items' event times."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.engine import EngineSettings, FerretPolicy, SkipReason, StreamEngine, admission, make_policy
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
    # a slow stream (25/s): W + D bring 3 items, but one delivery of 256 records must fit (one per worker)
    assert queue_slots(0.0004, 0.1, 0.04, 1) == 3
    assert queue_slots(0.0004, 0.1, 0.04, 1, delivery_items=256) == 256
    assert queue_slots(0.0004, 0.1, 0.04, 3, delivery_items=256) == 86
    with pytest.raises(ConfigError):
        queue_slots(0.0, 0.0, 0.01, 1, delivery_items=0)
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


def _in_order_reference(event_times: list[float], service: float, wait: float) -> list[bool]:
    """The rule as the module docstring states it for items delivered in event-time order."""
    ready, taken = -math.inf, []
    for event in event_times:
        taken.append(ready - event <= wait)
        if taken[-1]:
            ready = max(ready, event) + service
    return taken


@given(
    gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=60),
    service=st.floats(0.0, 0.05),
    wait=st.floats(0.0, 0.05),
)
def test_in_event_time_order_the_rule_is_the_plain_recursion(gaps: list[float], service: float, wait: float) -> None:
    rule = EventTimeAdmission(1, max_wait_s=wait)
    events = list(itertools.accumulate(gaps))
    assert [rule.admit(0, e, service) for e in events] == _in_order_reference(events, service, wait)


def _partition_order(event_times: list[float], partition_of: list[int], chunk: int) -> list[float]:
    """The order a consumer delivers items in: each partition's items in order, the partitions in turns,
    ``chunk`` records of one partition per turn (Kafka's fetch, one partition's batch after another's)."""
    queues = [[e for e, p in zip(event_times, partition_of, strict=True) if p == q] for q in sorted(set(partition_of))]
    delivered: list[float] = []
    while any(queues):
        for q in queues:
            delivered += q[:chunk]
            del q[:chunk]
    return delivered


@given(
    gaps=st.lists(st.floats(0.0, 0.1), min_size=1, max_size=80),
    slack=st.floats(0.0, 1.0),
    partitions=st.integers(1, 4),
    chunk=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_a_worker_that_keeps_up_takes_every_item_in_any_partition_order(
    gaps: list[float], slack: float, partitions: int, chunk: int, seed: int
) -> None:
    """A measured cause of `busy` skips at a slow rate: with two partitions the consumer
    hands over one partition's items, then the other's, stamped earlier. Items at least one service time
    apart are all admitted, whatever the delivery order (W = 0: the strictest rule, 1-Skip's)."""
    service = min(gaps) * slack
    events = list(itertools.accumulate(gaps))
    partition_of = [random.Random(seed + i).randrange(partitions) for i in range(len(events))]
    rule = EventTimeAdmission(1, max_wait_s=0.0)
    assert all(rule.admit(0, e, service) for e in _partition_order(events, partition_of, chunk))


def test_the_measured_delivery_is_admitted() -> None:
    """The first delivery of tests/integration/...::test_a_declared_slow_stream_gets_one_worker_that_trains_
    every_item as the trainer logged it (25 items/s, W = 0.4 ms, assumed service 3.57 ms): ten items of one
    partition, then three of the other stamped earlier. The high-water-mark rule skipped those three."""
    delivered = [54.944, 54.984, 55.064, 55.104, 55.144, 55.184, 55.224, 55.264, 55.304, 55.344, 54.864, 54.904, 55.024]
    rule = EventTimeAdmission(1, max_wait_s=0.0004)
    assert all(rule.admit(0, e, 0.00357) for e in delivered)
    assert rule.wait(0, 55.384) == 0.0  # and the next item finds the worker free


def test_overload_is_overload_in_any_delivery_order() -> None:
    """An item every 10 ms, 19 ms each: half are trained whether delivered in order or evens then odds
    (an odd item placed by its event time waits 9 ms for the even one before it)."""
    events = [0.010 * i for i in range(20)]
    in_order = EventTimeAdmission(1, max_wait_s=0.001)
    by_partition = EventTimeAdmission(1, max_wait_s=0.001)
    taken_in_order = [in_order.admit(0, e, 0.019) for e in events]
    taken = {e: by_partition.admit(0, e, 0.019) for e in events[0::2] + events[1::2]}
    assert sum(taken_in_order) == sum(taken.values()) == 10
    assert all(taken[e] for e in events[0::2]) and not any(taken[e] for e in events[1::2])


def test_an_item_older_than_every_remembered_one_waits_behind_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission, "RETAINED_ITEMS", 4)
    rule = EventTimeAdmission(1, max_wait_s=0.0)
    # items stamped 1..10 s, 0.5 s each; past 4 remembered the oldest are folded away (1-3, then 4-6)
    assert all(rule.admit(0, 1.0 + i, 0.5) for i in range(10))
    assert rule.wait(0, 0.5) == pytest.approx(6.5 - 0.5)  # behind the folded items (the last ends at 6.5)
    assert not rule.admit(0, 0.5, 0.5)
    assert rule.admit(0, 10.5, 0.5)  # a recent one is still placed among the remembered items


def test_service_times_fold_busy_time_per_item() -> None:
    times = ServiceTimes(1, 2, initial=0.5, window=2, samples=1)
    assert times.service_time(0) == 0.5
    for _ in range(2):  # two items: stage 0 busy 1 + 2 ms each, stage 1 busy 3 + 4 ms each
        times.record(0, 0, 0.001, forward=True)
        times.record(0, 0, 0.002, forward=False)
        times.record(0, 1, 0.003, forward=True)
        times.record(0, 1, 0.004, forward=False)
    # folding happens at the window's forwards: stage 1's second item had its F (3 ms) but not yet its B
    assert times.service_time(0) == pytest.approx((0.003 + 0.004 + 0.003) / 2)


def _fold(times: ServiceTimes, per_item: float) -> None:
    for _ in range(times.window):
        times.record(0, 0, per_item, forward=True)


def test_one_slow_window_does_not_move_the_service_time() -> None:
    """The measured benchmarks/live case: a fresh pipeline's first window took 124 ms per item, then 5 ms;
    the estimate must not say the worker is busier than the 13.9 ms arrival interval meanwhile."""
    times = ServiceTimes(1, 1, initial=0.0007)
    _fold(times, 0.124)
    assert times.service_time(0) == pytest.approx(0.0007)
    for _ in range(2):
        _fold(times, 0.005)
        assert times.service_time(0) < 0.0139
    assert times.service_time(0) == pytest.approx(0.005)


def test_a_lasting_slowdown_is_followed_within_three_windows() -> None:
    times = ServiceTimes(1, 1, initial=0.005)
    for _ in range(2):
        _fold(times, 0.020)
    assert times.service_time(0) == pytest.approx(0.005)
    _fold(times, 0.020)
    assert times.service_time(0) == pytest.approx(0.020)


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


def test_the_wall_clock_admits_two_partitions_delivered_in_turns() -> None:
    """Items 5 s apart on two partitions, delivered as one partition's batch then the other's (the
    order a Kafka consumer hands them over): every one is trained."""
    admission = AdmissionSettings(max_wait_s=0.0, queue_slots=64, initial_service_s=0.5)
    events = [5.0 * i for i in range(12)]
    assert _clock_outcomes(events[0::2] + events[1::2], admission) == [None] * 12


def test_a_full_queue_makes_an_item_busy_whatever_its_event_time() -> None:
    admission = AdmissionSettings(max_wait_s=math.inf, queue_slots=1, initial_service_s=0.5)
    outcomes = _clock_outcomes([float(i) for i in range(12)], admission)
    assert outcomes[0] is None and SkipReason.BUSY in outcomes  # at most one waits behind the running one
    assert len(outcomes) == 12


def test_without_an_event_time_the_policys_slot_rule_decides() -> None:
    admission = AdmissionSettings(max_wait_s=0.0, queue_slots=64, initial_service_s=0.5)
    outcomes = _clock_outcomes(None, admission)
    assert outcomes[0] is None and SkipReason.BUSY in outcomes  # one waiting slot (Ferret's)


def test_a_busy_skip_says_why_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    admission = AdmissionSettings(max_wait_s=0.0, queue_slots=64, initial_service_s=0.5)
    with caplog.at_level("DEBUG", logger="ferret.admission"):
        _clock_outcomes([5.0] * 3, admission)
    assert "busy (would wait > W): worker 0" in caplog.text and "vs W 0.0000 s" in caplog.text


def test_a_pipeline_schedule_admits_by_event_time_on_the_wall_clock() -> None:
    """The schedules' own scheduler (DAPPLE's flush groups) takes the admission queue's K too."""
    plan = make_plan(2, 2, num_units=2)
    setup = make_policy("dapple", plan).setup("tiny", 2, 1.0)
    engine = StreamEngine(tiny_units(num_units=2), setup, EngineSettings(keep_trace=False, validate=False))
    admission = AdmissionSettings(max_wait_s=math.inf, queue_slots=64, initial_service_s=0.0)
    with engine.wall_clock(admission=admission) as clock:
        futures = [clock.submit(item.x, item.y, event_time=5.0 * i) for i, item in enumerate(stream(8))]
        outcomes = [f.result(60).skipped for f in futures]
        clock.drain(60)
    assert len(outcomes) == 8 and outcomes[0] is None


def test_w_is_read_in_the_machines_time() -> None:
    """W = ln 2 / c is given in the profile's seconds: a worker measured k times slower than its profile
    waits k × W (with the default c: one measured service time); W = 0 (1-Skip) and W = ∞ stay."""
    settings = AdmissionSettings(max_wait_s=0.0011, queue_slots=8, profile_service_s=0.0011)
    assert settings.wait_for(0.0011) == pytest.approx(0.0011)
    assert settings.wait_for(0.014) == pytest.approx(0.014)
    assert settings.wait_for(0.0005) == pytest.approx(0.0005)
    assert AdmissionSettings(max_wait_s=0.002, queue_slots=8, profile_service_s=0.001).wait_for(0.014) == pytest.approx(
        0.028
    )
    assert AdmissionSettings(max_wait_s=0.0011, queue_slots=8).wait_for(0.014) == 0.0011  # no profile time given
    assert AdmissionSettings(max_wait_s=0.0, queue_slots=8, profile_service_s=0.001).wait_for(0.014) == 0.0
    assert AdmissionSettings(max_wait_s=math.inf, queue_slots=8, profile_service_s=0.001).wait_for(0.014) == math.inf
    with pytest.raises(ConfigError):
        AdmissionSettings(max_wait_s=0.001, queue_slots=8, profile_service_s=-1.0)
    with pytest.raises(ConfigError):
        AdmissionSettings(max_wait_s=0.001, queue_slots=8, profile_service_s=math.nan)


@given(
    st.lists(st.floats(0.0, 0.02), min_size=1, max_size=40),
    st.floats(0.0005, 0.02),
    st.floats(0.0005, 0.005),
)
def test_a_longer_w_admits_every_item_a_shorter_one_does(gaps: list[float], service: float, profile: float) -> None:
    """Read in the machine's time, W only grows when the worker is slower than its profile: every item
    the profile's W admits is admitted (the timelines agree while both admit everything)."""
    settings = AdmissionSettings(max_wait_s=profile, queue_slots=8, profile_service_s=profile)
    short, scaled = EventTimeAdmission(1, profile), EventTimeAdmission(1, profile)
    event = 0.0
    for gap in gaps:
        event += gap
        a = short.admit(0, event, service)
        b = scaled.admit(0, event, service, settings.wait_for(service))
        if service >= profile:
            assert b or not a
        if a != b:
            break


def test_an_item_arriving_while_the_worker_trains_waits_one_measured_step() -> None:
    """A slow machine (benchmarks/live's 0.25× case) in small: the profile says 1 ms per item, the worker
    takes 4 ms; an item stamped 2 ms after the previous one would wait 2 ms. ln 2 / c in wall seconds
    (1 ms) would skip it; read in the machine's time (4 ms) it is admitted, and one stamped at the same
    instant as a third is not."""
    settings = AdmissionSettings(max_wait_s=0.001, queue_slots=8, profile_service_s=0.001)
    wall = EventTimeAdmission(1, settings.max_wait_s)
    assert wall.admit(0, 0.0, 0.004) and not wall.admit(0, 0.002, 0.004)
    machine = EventTimeAdmission(1, settings.max_wait_s)
    w = settings.wait_for(0.004)
    assert machine.admit(0, 0.0, 0.004, w) and machine.admit(0, 0.002, 0.004, w)
    assert not machine.admit(0, 0.002, 0.004, w)  # would wait 6 ms > 4 ms


def test_the_measured_service_time_counts_what_a_busy_worker_spends_between_actions() -> None:
    """The admission rule's service time is what an item costs the worker, not its actions alone: with
    3 ms spent after every action (here: in the pipeline's ``pull``, which the executor calls under the
    lock after each action; live, the lock and the GIL the record path holds) a busy worker's measured
    service time per item (F and B) is at least 2 × 3 ms. Counting the actions alone, it was the tiny
    model's fraction of a millisecond, and the rule admitted more items than the worker trained."""
    import time as _time

    plan = make_plan(1, 1)
    setup = FerretPolicy(plan).setup("tiny", plan.partition.num_units, 1.0)
    engine = StreamEngine(tiny_units(num_units=1), setup, EngineSettings(keep_trace=False, validate=False))
    pull = engine.pipeline.pull

    def slow_pull() -> tuple[int, ...]:
        _time.sleep(0.003)
        return pull()

    engine.pipeline.pull = slow_pull  # type: ignore[method-assign]
    admission = AdmissionSettings(max_wait_s=math.inf, queue_slots=64, initial_service_s=0.0)
    with engine.wall_clock(admission=admission) as clock:
        futures = [clock.submit(item.x, item.y, event_time=0.0) for item in stream(24)]
        assert all(f.result(60).skipped is None for f in futures)
        clock.drain(60)
        assert clock.service_times.service_time(0) >= 2 * 0.003


def test_the_real_queue_is_bounded_by_w_plus_h_in_service_times() -> None:
    """⌊(W + H) / s⌋ items may wait (at least 1); no bound without H or while s is unknown; an item that
    would start later than that is ``busy`` whatever the event-time rule says."""
    settings = AdmissionSettings(max_wait_s=0.005, queue_slots=256, start_horizon_s=0.1)
    assert settings.start_slots(0.005, 0.005) == 21
    assert settings.start_slots(0.0, 0.5) == 1
    assert AdmissionSettings(max_wait_s=0.005, queue_slots=256).start_slots(0.005, 0.005) is None
    assert settings.start_slots(math.inf, 0.005) is None
    with pytest.raises(ConfigError):
        AdmissionSettings(max_wait_s=0.0, queue_slots=1, start_horizon_s=-1.0)
    bounded = AdmissionSettings(max_wait_s=math.inf, queue_slots=64, initial_service_s=0.5)
    assert SkipReason.BUSY not in _clock_outcomes([0.0] * 6, bounded)  # W = ∞: every item waits
    bounded = AdmissionSettings(max_wait_s=0.0, queue_slots=64, initial_service_s=0.5, start_horizon_s=1.0)
    outcomes = _clock_outcomes([5.0 * i for i in range(12)], bounded)  # the event times say: all free
    assert outcomes[0] is None and SkipReason.BUSY in outcomes  # but 2 wait at most (1 s / 0.5 s)
