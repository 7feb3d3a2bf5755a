"""The declared stream rate: ``ferret produce --rate`` stamps it, the trainer plans for its share."""

from __future__ import annotations

import threading

import pytest

from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from services.kafka.rate_headers import PARTITIONS_HEADER, RATE_HEADER, declared_interval, rate_headers
from services.trainer.arrivals import DriftReplanner, SwitchablePlanner

from .planner_fixtures import golden_a


def test_a_trainer_expects_its_share_of_the_declared_rate() -> None:
    headers = rate_headers(200.0, 4)
    assert declared_interval(headers, owned=4) == pytest.approx(1 / 200)
    assert declared_interval(headers, owned=1) == pytest.approx(1 / 50)
    assert declared_interval(headers, owned=0) == pytest.approx(1 / 200)  # assignment unknown yet
    assert declared_interval(dict(headers), owned=2) == pytest.approx(1 / 100)  # headers as a mapping


@pytest.mark.parametrize(
    "headers",
    [
        None,
        [],
        [("other", b"1")],
        [(RATE_HEADER, b"fast")],
        [(RATE_HEADER, b"-3")],
        [(RATE_HEADER, b"nan")],
        [(RATE_HEADER, b"10"), (PARTITIONS_HEADER, b"zero")],
        [(RATE_HEADER, None)],
    ],
)
def test_headers_that_do_not_declare_a_rate_are_ignored(headers: object) -> None:
    assert declared_interval(headers, owned=1) is None  # type: ignore[arg-type]


def test_a_declared_rate_replans_at_once_and_measurements_wait_for_the_cooldown() -> None:
    planner = Planner(
        golden_a(), PlannerSettings(arrival_interval=3.0, decay=0.05, memory=MemorySettings.paper_elements())
    )
    switch = SwitchablePlanner(planner)
    requested = threading.Semaphore(0)
    drift = DriftReplanner(switch, lambda: None, ratio=1.5, cooldown_s=3600).start(lambda b: requested.release())
    try:
        drift.observe(0, 0, rate_headers(1 / 12.0, 1))  # one item every 12 s: declared
        assert requested.acquire(timeout=10)
        assert switch.current.arrival_interval == pytest.approx(12.0)
        drift.observe(1, 0, rate_headers(1 / 12.0, 1))  # the same declaration again: nothing to do
        drift.offer(40.0)  # a measurement within the cooldown: not applied
        drift.observe(2, 0, rate_headers(1 / 40.0, 1))  # a new declaration is
        assert requested.acquire(timeout=10)
        assert switch.current.arrival_interval == pytest.approx(40.0)
    finally:
        drift.close()
    assert drift.replans == 2
