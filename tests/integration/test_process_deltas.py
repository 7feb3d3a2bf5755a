"""Iter-Fisher (Alg. 1) on executor processes: the stage's delta ring in shared memory
(:mod:`ferret_core.engine.processes.deltas`) that every executor of the stage reads and the updater pushes.

A reader in another process sees the pushes (and the other way round); with 2 workers the executed trace
validates, every master update is pushed exactly once, no call is cut short unless staler than the ring,
and each stale gradient's compensation equals :class:`IterFisherCompensator` run in this process on the
same gradient, state and deltas — deltas that telescope to θ_now − θ_then, so they include the other
worker's updates (a ring of the executor's own updates would not).
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import pytest
import torch
import torch.multiprocessing as tmp
from torch import Tensor
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings
from ferret_core.compensation.fisher import fisher_step
from ferret_core.compensation.iter_fisher import IterFisherCompensator
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.staleness import ring_capacity
from tests.integration.test_process_executors import setup_for
from tests.unit.test_engine_equivalence import EXACT
from tests.unit.test_engine_support import make_plan, stream, tiny_units

pytestmark = pytest.mark.integration

SHAPES = [(2, 3), (3,)]


def _delta(value: float) -> list[Tensor]:
    return [torch.full(s, value) for s in SHAPES]


def _read_then_push(conn: Connection, store: SharedDeltas) -> None:
    """In another process: report what the ring holds, then push one more delta."""
    ring = store.ring()
    conn.send((ring.pushed, [float(d[0][0, 0]) for d in ring.recent(store.capacity)]))
    ring.push(_delta(9.0))
    conn.send("pushed")


def test_a_reader_in_another_process_sees_the_pushes_and_its_push_is_seen() -> None:
    store = SharedDeltas(0, [torch.zeros(s) for s in SHAPES], 3)
    for v in range(1, 5):
        store.ring().push_difference(_delta(float(v)), _delta(0.0))
    ctx = tmp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_read_then_push, args=(child, store))
    process.start()
    try:
        assert parent.poll(60)
        assert parent.recv() == (4, [2.0, 3.0, 4.0])
        assert parent.poll(30) and parent.recv() == "pushed"
    finally:
        process.join(30)
    assert process.exitcode == 0
    assert store.pushed == 5 and [float(d[0][0, 0]) for d in store.ring().recent(3)] == [3.0, 4.0, 9.0]


def test_iter_fisher_on_two_worker_processes_walks_every_workers_deltas() -> None:
    units, items = tiny_units(), stream(80)
    plan = make_plan(1, 2, num_units=3)
    capacity = ring_capacity(plan, 0)
    settings = ProcessSettings(lr=0.05, compensator="iter-fisher", queue_slots=4, record_compensations=1000)
    with ProcessClock(units, setup_for(plan), settings) as clock:
        for burst in range(0, len(items), 20):  # bursts that keep both workers busy, then drain
            for item in items[burst : burst + 20]:
                clock.submit(item.x, item.y)
            clock.drain(timeout=60)
        clock.validate()
        c = clock.counters
        store = clock.deltas[0]
        assert store is not None and store.capacity == capacity
        version = clock.stages[0].current_version()
        assert store.pushed == version == sum(c.updates[n][0] for n in range(2)) == c.trained  # each update once
        params = clock.master_state()[0]
        reports = clock.compensations()
    assert [(r.worker, r.stage) for r in reports] == [(0, 0), (1, 0)]
    for report in reports:
        assert len(report.records) == report.stats["compensated"]  # every stale call recorded
        assert report.stats["truncated"] == sum(r["staleness"] > capacity for r in report.records)
    records = [r for report in reports for r in report.records]
    assert records, "no gradient was stale: the stream did not keep both workers busy"
    shapes = [p.shape for p in params.values()]
    changed = 0
    for record in records:
        tau = record["staleness"]
        reference = IterFisherCompensator([torch.zeros(s) for s in shapes], CompensatorSettings(), capacity)
        reference.load_state_dict(record["state"])  # the executor's λ, v_r, v_a and the shared ring's deltas
        out = reference.compensate(
            record["grads"], staleness=tau, theta_then=record["theta_then"], theta_now=record["theta_now"]
        )
        assert_close(out, record["out"], **EXACT)
        deltas = record["state"]["ring"]["deltas"][-tau:]
        if tau <= capacity:  # the ring held every update since the gradient's version, any worker's
            assert len(deltas) == tau
            walked = [sum(d[i] for d in deltas) for i in range(len(shapes))]
            gap = [now - then for now, then in zip(record["theta_now"], record["theta_then"], strict=True)]
            assert_close(walked, gap, rtol=1e-5, atol=1e-7)
        if not all(torch.equal(o, g) for o, g in zip(record["out"], record["grads"], strict=True)):
            changed += 1
            if tau > 1:  # the check can fail: the last delta alone is not what the executor applied
                alone = fisher_step(record["grads"], deltas[-1], reference.stats()["lambda"])
                assert not all(torch.equal(a, o) for a, o in zip(alone, record["out"], strict=True))
    assert changed > 0  # the compensation did change gradients, so the equality above means something
