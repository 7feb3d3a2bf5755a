"""The compensators that learn from gradients on executor processes: DC-ASGD-a's mean square and
Iter-Fisher's λ, v_r and v_a in the stage's shared memory (:mod:`ferret_core.engine.processes.tuning`),
updated by every executor of the stage under its update lock, as the thread engine's one compensator per
stage is.

With 2 workers over one stage: the shared state learns from both workers' gradients (DC-ASGD-a's count of
gradients folded is the sum of both executors' calls, and no two calls saw the same count), both executors
report the one λ, each recorded compensation equals the compensator run in this process on the same
gradient, versions and state, and a worker a re-plan brings back learns on from the stage's state.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.carry import carry_compensator_states
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.errors import ConfigError
from ferret_core.staleness import ring_capacity
from tests.integration.test_process_executors import setup_for
from tests.unit.test_engine_equivalence import EXACT
from tests.unit.test_engine_support import make_plan, stream, tiny_units

pytestmark = pytest.mark.integration

TUNING = CompensatorSettings(eta_lambda=0.05)  # λ steps that move it visibly in a short run


def _train_in_bursts(clock: ProcessClock, count: int) -> None:
    """Bursts that keep both workers busy (so gradients are stale), each drained."""
    items = stream(count)
    for burst in range(0, count, 20):
        clock.submit_many([i.x for i in items[burst : burst + 20]], [i.y for i in items[burst : burst + 20]])
        clock.drain(timeout=60)


def _replay(name: str, records: list[dict], shapes: list[torch.Size], bound: int) -> None:  # type: ignore[type-arg]
    """Each recorded call, run again here on the state the executor read, gives what the executor gave."""
    for record in records:
        reference = make_compensator(name, [torch.zeros(s) for s in shapes], TUNING, bound)
        reference.load_state_dict(record["state"])
        out = reference.compensate(
            record["grads"], staleness=record["staleness"], theta_then=record["theta_then"],
            theta_now=record["theta_now"],
        )
        assert_close(out, record["out"], **EXACT)


def test_dc_asgd_a_on_two_worker_processes_learns_from_every_workers_gradients() -> None:
    plan = make_plan(1, 2, num_units=3)
    assert ring_capacity(plan, 0) > 0  # the stage can be stale: it keeps a mean square
    settings = ProcessSettings(
        lr=0.05, compensator="dc-asgd-a", compensator_settings=TUNING, queue_slots=4, record_compensations=1000
    )
    with ProcessClock(tiny_units(), setup_for(plan), settings) as clock:
        _train_in_bursts(clock, 80)
        c = clock.counters
        assert {n for n in range(2) if c.updates[n][0] > 0} == {0, 1}
        tuning = clock.tunings[0]
        seen = int(tuning.tensors()[0][0])
        assert clock.shared_bytes() == sum(s.nbytes() for s in clock.stages) + tuning.nbytes()
        params = clock.master_state()[0]
        reports = clock.compensations()
    calls = [int(r.stats["calls"]) for r in reports]
    assert seen == sum(calls) == c.trained  # one mean square folded every gradient of both workers
    assert all(0 < n < seen for n in calls)  # ... which neither worker's own count would have reached
    records = [r for report in reports for r in report.records]
    assert records, "no gradient was stale: the stream did not keep both workers busy"
    counts = [int(r["state"]["seen"]) for r in records]
    assert len(set(counts)) == len(counts)  # one count, advanced under the stage's lock: never read twice
    _replay("dc-asgd-a", records, [p.shape for p in params.values()], ring_capacity(plan, 0))


def test_iter_fisher_on_two_worker_processes_tunes_one_lambda_per_stage() -> None:
    plan = make_plan(1, 2, num_units=3)
    settings = ProcessSettings(
        lr=0.05, compensator="iter-fisher", compensator_settings=TUNING, queue_slots=4, record_compensations=1000
    )
    with ProcessClock(tiny_units(), setup_for(plan), settings) as clock:
        _train_in_bursts(clock, 80)
        lam = float(clock.tunings[0].tensors()[0])
        params = clock.master_state()[0]
        reports = clock.compensations()
    assert lam != TUNING.lambda0  # tuned
    assert [r.stats["lambda"] for r in reports] == [lam, lam]  # both executors apply the stage's one λ
    compensated = [int(r.stats["compensated"]) for r in reports]
    assert all(n > 0 for n in compensated), compensated
    records = [r for report in reports for r in report.records]
    lambdas = [float(r["state"]["lambda"]) for r in records]
    assert len(set(lambdas)) == len(lambdas)  # every stale call stepped the one λ: no value was read twice
    _replay("iter-fisher", records, [p.shape for p in params.values()], ring_capacity(plan, 0))


def test_a_worker_a_replan_brings_back_learns_on_from_the_stages_state() -> None:
    two = make_plan(1, 2, num_units=3)
    one = make_plan(1, 2, num_units=3, live=[True, False])
    settings = ProcessSettings(
        lr=0.05, compensator="dc-asgd-a", compensator_settings=TUNING, queue_slots=4, record_compensations=1000
    )
    with ProcessClock(tiny_units(), setup_for(two), settings) as clock:
        tuning = clock.tunings[0]
        _train_in_bursts(clock, 20)
        clock.replan(setup_for(one))
        _train_in_bursts(clock, 20)
        before = int(tuning.tensors()[0][0])
        clock.replan(setup_for(two))
        assert clock.tunings[0] is tuning  # the same shared memory, not a new mean square
        _train_in_bursts(clock, 40)
        assert int(tuning.tensors()[0][0]) == clock.counters.trained > before
        reports = clock.compensations()
    back = next(r for r in reports if r.worker == 1)  # the process the last re-plan started
    assert back.records, "the worker brought back computed no stale gradient"
    assert min(int(r["state"]["seen"]) for r in back.records) >= before  # it read the state learnt before it came


def test_the_stages_shared_state_is_saved_and_carried_to_a_new_clock() -> None:
    """``compensator_states`` reads the shared state as one compensator's ``state_dict()`` (the thread engine's
    format, what a snapshot keeps); a new clock loads what it can use of it (λ, v_r, v_a), its own delta
    ring left as it is (empty: its deltas would be of the old clock's versions)."""
    plan = make_plan(1, 2, num_units=3)
    settings = ProcessSettings(lr=0.05, compensator="iter-fisher", compensator_settings=TUNING, queue_slots=4)
    with ProcessClock(tiny_units(), setup_for(plan), settings) as clock:
        _train_in_bursts(clock, 60)
        (saved,) = clock.compensator_states()
        shared = [t.clone() for t in clock.tunings[0].tensors()]
        ring = clock.deltas[0]
        assert ring is not None and saved["ring"]["pushed"] == ring.pushed > 0
    assert saved["lambda"] == float(shared[0]) != TUNING.lambda0
    k = len(saved["v_r"])
    assert_close(saved["v_r"], shared[2 : 2 + k], **EXACT)
    assert_close(saved["v_a"], shared[2 + k :], **EXACT)
    with ProcessClock(tiny_units(), setup_for(plan), settings) as clock:
        (fresh,) = clock.compensator_states()
        assert fresh["lambda"] == TUNING.lambda0
        (carried,) = carry_compensator_states([saved], [fresh], same_partition=True)
        clock.load_compensator_states([carried])
        (loaded,) = clock.compensator_states()
        assert loaded["lambda"] == saved["lambda"]
        assert_close(loaded["v_r"], saved["v_r"], **EXACT)
        assert_close(loaded["v_a"], saved["v_a"], **EXACT)
        assert loaded["ring"]["pushed"] == 0 and loaded["ring"]["deltas"] == []  # the new clock's own, still empty
        _train_in_bursts(clock, 40)  # the workers learn on from the loaded λ
        (after,) = clock.compensator_states()
        assert after["lambda"] != saved["lambda"] and after["ring"]["pushed"] > 0
        with pytest.raises(ConfigError, match="for 2 stages, this plan has 1"):
            clock.load_compensator_states([carried, carried])
