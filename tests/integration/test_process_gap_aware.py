"""Gap-Aware on executor processes: the stage's average step C and its count n in shared memory
(:mod:`ferret_core.engine.processes.average`), folded by the executor that updates the master and read by
every executor of the stage.

A fold in another process is seen here (and equals the thread compensator's fold of the same deltas); with
2 workers every item is accounted for, every master update is folded exactly once whichever worker made it
(n = the master version = both workers' updates), stale gradients are compensated (counted, and changed),
each compensation equals :class:`GapAwareCompensator` run in this process on the same gradient, versions,
C and n, the weights stay finite and the executed trace validates.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import pytest
import torch
import torch.multiprocessing as tmp
from torch import Tensor
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.compensation.simple import GapAwareCompensator
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.engine.processes.average import SharedStepAverage
from ferret_core.staleness import ring_capacity
from tests.integration.test_process_executors import setup_for
from tests.unit.test_engine_equivalence import EXACT
from tests.unit.test_engine_support import make_plan, stream, tiny_units

pytestmark = pytest.mark.integration

SHAPES = [(2, 3), (3,)]


def _delta(value: float) -> list[Tensor]:
    return [torch.full(s, value) * torch.arange(1, 1 + torch.Size(s).numel()).reshape(s) for s in SHAPES]


def _fold_in_a_child(conn: Connection, average: SharedStepAverage) -> None:
    """In another process, as an executor does: a compensator over the shared C and n folds one update."""
    compensator = make_compensator("gap-aware", [torch.zeros(s) for s in SHAPES], CompensatorSettings(), 1)
    compensator.share_average(average.tensors(), average.count)
    conn.send(average.updates)
    compensator.observe_update(_delta(-0.3))
    conn.send("folded")


def test_a_fold_in_another_process_is_seen_and_is_the_thread_compensators_fold() -> None:
    params = [torch.zeros(s) for s in SHAPES]
    average = SharedStepAverage(0, params)
    here = make_compensator("gap-aware", params, CompensatorSettings(), 1)
    here.share_average(average.tensors(), average.count)
    reference = GapAwareCompensator(params, CompensatorSettings(), 1)
    for v in (0.1, 0.2):
        here.observe_update(_delta(v))
        reference.observe_update(_delta(v))
    ctx = tmp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_fold_in_a_child, args=(child, average))
    process.start()
    try:
        assert parent.poll(60) and parent.recv() == 2  # it sees the folds made here
        assert parent.poll(30) and parent.recv() == "folded"
    finally:
        process.join(30)
    assert process.exitcode == 0
    reference.observe_update(_delta(-0.3))
    assert average.updates == 3 and here.state_dict()["updates"] == 3
    assert_close(average.tensors(), reference.state_dict()["avg_step"], **EXACT)


def test_gap_aware_on_two_worker_processes_folds_every_workers_updates() -> None:
    units, items = tiny_units(), stream(80)
    plan = make_plan(1, 2, num_units=3)
    assert ring_capacity(plan, 0) > 0  # the stage can be stale: it gets a shared C
    settings = ProcessSettings(lr=0.05, compensator="gap-aware", queue_slots=4, record_compensations=1000)
    with ProcessClock(units, setup_for(plan), settings) as clock:
        arrivals = []
        for burst in range(0, len(items), 20):  # bursts that keep both workers busy, then drain
            arrivals += [clock.submit(item.x, item.y) for item in items[burst : burst + 20]]
            clock.drain(timeout=60)
        clock.validate()
        c = clock.counters
        skipped = sum(c.skipped.values())
        assert c.items == len(items) == len(arrivals) and c.trained + skipped == len(items) and c.trained > 0
        assert {a.worker for a in arrivals if a.skipped is None} == {0, 1}
        average = clock.averages[0]
        assert average is not None and clock.deltas == [None]  # a shared C, no ring
        version = clock.stages[0].current_version()
        # every master update folded exactly once, whichever worker made it (accumulation 1: one per item)
        assert average.updates == version == sum(c.updates[n][0] for n in range(2)) == c.trained
        folded = [t.clone() for t in average.tensors()]
        params = clock.master_state()[0]
        shared = clock.shared_bytes()
        assert shared == sum(s.nbytes() for s in clock.stages) + average.nbytes()
        reports = clock.compensations()
    assert all(torch.isfinite(t).all() for t in params.values())
    assert all(torch.isfinite(t).all() for t in folded) and any(t.abs().sum() > 0 for t in folded)
    assert [(r.worker, r.stage) for r in reports] == [(0, 0), (1, 0)]
    for report in reports:
        assert len(report.records) == report.stats["compensated"]  # every stale call recorded
        assert report.stats["truncated"] == 0  # C is kept wherever the stage can be stale
    records = [r for report in reports for r in report.records]
    assert records, "no gradient was stale: the stream did not keep both workers busy"
    shapes = [p.shape for p in params.values()]
    changed = 0
    for record in records:
        assert 0 < record["staleness"] <= record["state"]["updates"] <= version
        reference = GapAwareCompensator([torch.zeros(s) for s in shapes], CompensatorSettings(), 1)
        reference.load_state_dict(record["state"])  # the shared C and n as the executor read them
        out = reference.compensate(
            record["grads"],
            staleness=record["staleness"],
            theta_then=record["theta_then"],
            theta_now=record["theta_now"],
        )
        assert_close(out, record["out"], **EXACT)
        if not all(torch.equal(o, g) for o, g in zip(record["out"], record["grads"], strict=True)):
            changed += 1
    assert changed > 0  # the gap did divide gradients, so the equality above means something
    assert any(report.stats["relative_correction_mean"] > 0 for report in reports)
    # n at a call counts both workers' updates: more than the calling worker ever made itself (a C of its
    # own would have folded only those)
    assert any(
        max((r["state"]["updates"] for r in report.records), default=0) > c.updates[report.worker][0]
        for report in reports
    )


def test_a_replan_keeps_the_shared_average_and_a_worker_brought_back_reads_it() -> None:
    """Re-plans on the same clock keep each stage's C and n (module docstring of .average): the worker a
    re-plan brings back is a new process over the C its stage folded while it was away, and n goes on
    counting every master update."""
    units, items = tiny_units(), stream(40)
    two = make_plan(1, 2, num_units=3)
    one = make_plan(1, 2, num_units=3, live=[True, False])
    settings = ProcessSettings(lr=0.05, compensator="gap-aware", queue_slots=4, record_compensations=1000)
    with ProcessClock(units, setup_for(two), settings) as clock:
        average = clock.averages[0]
        assert average is not None
        clock.submit_many([i.x for i in items[:10]], [i.y for i in items[:10]])
        clock.drain(timeout=60)
        clock.replan(setup_for(one))
        clock.submit_many([i.x for i in items[10:20]], [i.y for i in items[10:20]])
        clock.drain(timeout=60)
        before = average.updates
        assert before == clock.stages[0].current_version() > 0
        clock.replan(setup_for(two))
        assert clock.averages[0] is average  # the same shared memory, not a new C
        clock.submit_many([i.x for i in items[20:]], [i.y for i in items[20:]])
        clock.drain(timeout=60)
        assert average.updates == clock.stages[0].current_version() == clock.counters.trained > before
        reports = clock.compensations()
    back = next(r for r in reports if r.worker == 1)  # the process the last re-plan started
    assert back.records, "the worker brought back computed no stale gradient"
    assert min(r["state"]["updates"] for r in back.records) >= before  # it read the C folded before it came
