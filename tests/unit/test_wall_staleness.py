"""Staleness on the wall clock (docs/service.md "Staleness"): the bound is not enforced, so the delta ring
follows the staleness reached (up to a limit) and a compensation cut short is counted and reported."""

from __future__ import annotations

import torch

from ferret_core.compensation import CompensatorSettings, DeltaRing, make_compensator
from services.control.messages import status_reply
from services.control.trainer_port import TrainerState, TrainerStatus
from services.trainer.learner import LearnerStats
from services.trainer.metrics import TrainerMetrics
from services.trainer.status import staleness_counters
from tests.unit.test_compensation import SHAPES, _drive, _params


def _delta(value: float) -> list[torch.Tensor]:
    return [torch.full(s, value, dtype=torch.float64) for s in SHAPES]


def test_a_grown_ring_keeps_its_order_and_fills_its_new_slots() -> None:
    ring = DeltaRing(2)
    for v in (1.0, 2.0, 3.0):  # full: holds 2, 3 (slot 0 was overwritten)
        ring.push(_delta(v))
    ring.grow(4)
    ring.push(_delta(4.0))
    ring.push(_delta(5.0))
    assert [float(d[0][0, 0]) for d in ring.recent(4)] == [2.0, 3.0, 4.0, 5.0]
    ring.push(_delta(6.0))
    assert [float(d[0][0, 0]) for d in ring.recent(4)] == [3.0, 4.0, 5.0, 6.0]
    ring.grow(3)  # never shrinks
    assert ring.capacity == 4


def test_a_cut_short_compensation_is_counted_and_grows_the_ring_up_to_its_limit() -> None:
    comp = make_compensator("iter-fisher", _params(), CompensatorSettings(), 2)
    comp.follow_staleness(5)
    versions = _drive(comp, 8)
    grads = [torch.ones(s, dtype=torch.float64) for s in SHAPES]
    comp.compensate(grads, staleness=4, theta_then=versions[4], theta_now=versions[8])
    assert comp.truncated == 1 and comp.stats()["truncated"] == 1.0
    _drive(comp, 4)
    comp.compensate(grads, staleness=4, theta_then=versions[4], theta_now=versions[8])  # the ring holds 4 now
    assert comp.truncated == 1
    comp.compensate(grads, staleness=7, theta_then=versions[1], theta_now=versions[8])  # beyond the limit 5
    _drive(comp, 7)
    comp.compensate(grads, staleness=7, theta_then=versions[1], theta_now=versions[8])
    assert comp.truncated == 3  # the ring stopped at 5 deltas


def test_a_grown_ring_restores_into_a_ring_allowed_to_grow() -> None:
    comp = make_compensator("iter-fisher", _params(), CompensatorSettings(), 2)
    comp.follow_staleness(8)
    versions = _drive(comp, 6)
    comp.compensate(list(_delta(1.0)), staleness=5, theta_then=versions[1], theta_now=versions[6])
    state = comp.state_dict()
    fresh = make_compensator("iter-fisher", _params(), CompensatorSettings(), 2)
    fresh.follow_staleness(8)
    fresh.load_state_dict(state)
    assert fresh.truncated == 1 and fresh.state_dict()["ring"]["capacity"] == 5


def test_cut_short_compensations_and_staleness_reach_status_and_metrics() -> None:
    stats = LearnerStats(1, 1, 0, 0, max_staleness=(7, 3), staleness_bound=(6, 3), compensations_truncated=4)
    counters = staleness_counters(stats)
    assert counters == {"staleness_max.0": 7, "staleness_max.1": 3, "staleness_bound.0": 6, "staleness_bound.1": 3}
    status = TrainerStatus(compensations_truncated=4, counters=counters)
    reply = status_reply(status, state=TrainerState.RUNNING, time_ms=0, uptime_s=1.0)
    assert reply.counters["compensations_truncated"] == 4 and reply.counters["staleness_max.0"] == 7
    metrics = TrainerMetrics()
    metrics.register(lambda: status, lambda: None)
    names = {(sample.name, sample.value) for family in metrics.registry.collect() for sample in family.samples}
    assert ("ferret_compensations_truncated_total", 4.0) in names
