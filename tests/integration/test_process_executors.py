"""Process executors (:mod:`ferret_core.engine.processes`): real OS processes over shared memory.

Transparency (one worker, no staleness ⇒ the plain SGD loop's weights, to the bit), the executed trace
through the validator, the counts, and failures: an executor's exception and a kill -9 reach the caller
within seconds and leave no process behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from ferret_core.compensation import COMPENSATOR_NAMES
from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.errors import ExecutorLost, ScheduleError
from ferret_core.plan import Plan
from ferret_core.schedule.scheduler import PlanRules
from tests.unit.test_engine_equivalence import EXACT, plain_sgd
from tests.unit.test_engine_support import IN_FEATURES, make_plan, stream, tiny_units
from tests.unit.test_step_guard import guarded_sgd

pytestmark = pytest.mark.integration


def setup_for(plan: Plan) -> PolicySetup:
    return PolicySetup("ferret", plan, PlanRules(plan), instant=False, planned=None)


def sequentially(clock: ProcessClock, items: list) -> None:
    """Every item trained before the next arrives (what a slow stream does)."""
    for item in items:
        arrival = clock.submit(item.x, item.y)
        assert arrival.skipped is None
        clock.drain(timeout=30)


@pytest.mark.parametrize("recompute", [False, True])
def test_one_worker_equals_the_plain_sgd_loop(recompute: bool) -> None:
    units, items = tiny_units(), stream(30)
    plan = make_plan(1, 1, num_units=3, recompute=recompute)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)) as clock:
        sequentially(clock, items)
        state = clock.master_state()[0]
        clock.validate()
        assert clock.counters.trained == 30 and clock.counters.updates[0] == [30]
        assert clock.counters.recomputes[0] == [30 if recompute else 0]
    assert_close(state, plain_sgd(units, items, 0.05), **EXACT)


@pytest.mark.parametrize(("accumulation", "ratio"), [(1, 0.05), (1, 0.3), (2, 0.1)])
def test_one_worker_under_the_norm_guard_equals_the_guard_written_out(accumulation: int, ratio: float) -> None:
    """The executor measures each gradient's norm with its non-finite check and hands it to the guard
    (step_guard.finite_norm); the weights must be those of the guard computed from scratch. Ratio 0.05
    scales some steps and leaves others after reading the weights (‖θ‖ ≈ 4.9, steps 0.16–0.62); 0.3
    leaves most steps below r itself, where the guard does not read the weights. Accumulation 2 (ratio
    0.1 scales some of the summed steps): the summed gradient's own norm (none is carried)."""
    units, items = tiny_units(), stream(30)
    lr = 0.1
    plan = make_plan(1, 1, num_units=3, accumulation=accumulation)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=lr, max_step_ratio=ratio)) as clock:
        sequentially(clock, items)
        state = clock.master_state()[0]
    reference, scaled = guarded_sgd(units, items, lr, ratio, accumulation)
    if ratio < 0.3:
        assert 0 < scaled < len(items) // accumulation  # both branches of the guard ran
    assert_close(state, reference, rtol=1e-5, atol=1e-6)


def test_predictions_come_from_the_master_and_carry_its_version() -> None:
    units, items = tiny_units(), stream(6)
    plan = make_plan(1, 1, num_units=3)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05, top_k=3)) as clock:
        versions = []
        for item in items:
            arrival = clock.submit(item.x, item.y)
            versions.append(arrival.version)
            assert len(arrival.top_k) == 3 and arrival.top_k[0] == (arrival.prediction, arrival.confidence)
            clock.drain(timeout=30)
    assert versions == [0, 1, 2, 3, 4, 5]  # each item predicted after every earlier one was trained


def test_two_workers_count_every_item_and_the_trace_validates() -> None:
    units, items = tiny_units(), stream(400)
    plan = make_plan(1, 2, num_units=3)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)) as clock:
        arrivals = [clock.submit(item.x, item.y) for item in items]
        clock.drain(timeout=60)
        c = clock.counters
        skipped = sum(c.skipped.values())
        assert c.items == 400 and c.trained + skipped == 400 and c.trained > 0
        assert {a.worker for a in arrivals if a.skipped is None} == {0, 1}
        assert all(a.worker == a.index % 2 for a in arrivals if a.skipped is None)
        assert sum(c.updates[n][0] for n in range(2)) == c.trained  # accumulation 1: one update per item
        assert clock.stages[0].current_version() == c.trained
        assert sum(clock.stages[0].readers()) == 2  # the two replicas: no stash or prediction pin is left
        clock.validate()
        usage = clock.usage()
    assert [(u.worker, u.stage) for u in usage] == [(0, 0), (1, 0)] and all(u.cpu_seconds > 0 for u in usage)


def test_accumulation_updates_once_per_c_a_gradients() -> None:
    units, items = tiny_units(), stream(20)
    plan = make_plan(1, 1, num_units=3, accumulation=2)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)) as clock:
        sequentially(clock, items)
        assert clock.counters.trained == 20 and clock.counters.updates[0] == [10]
        clock.validate()


def test_an_executor_exception_reaches_the_caller_naming_the_item() -> None:
    units, items = tiny_units(), stream(4)
    plan = make_plan(1, 1, num_units=3)
    clock = ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)).start()
    try:
        sequentially(clock, items[:2])
        clock.submit(items[2].x, items[2].y, index=7)
        # the executor's forward gets a sample it cannot take (the coordinator predicted item 7 already)
        clock.dispatch.inputs[8] = torch.randn(IN_FEATURES + 3)
        clock.dispatch.targets[8] = 1
        clock.scheduler.admit(0, 8, 0)
        with pytest.raises(ScheduleError, match="item 8") as caught:
            clock.drain(timeout=30)
        assert "Traceback" in str(caught.value) and clock.failed_item == 8
    finally:
        clock.close(reraise=False)
    assert all(not p.is_alive() for p in clock._processes.values())


def test_a_killed_executor_stops_the_clock_within_seconds() -> None:
    units = tiny_units(width=256)
    plan = make_plan(1, 2, num_units=3)
    clock = ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.01)).start()
    victim = clock._processes[(1, 0)]
    try:
        for item in stream(50):
            clock.submit(item.x, item.y)
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.perf_counter()
        with pytest.raises(ScheduleError, match="worker 1"):
            deadline = t0 + 5.0
            while time.perf_counter() < deadline:
                for item in stream(5, seed=int(time.perf_counter() * 1000) % 1000):
                    clock.submit(item.x, item.y)
                time.sleep(0.05)
            clock.drain(timeout=5)
        assert time.perf_counter() - t0 < 5.0
    finally:
        clock.close(reraise=False)
    assert all(not p.is_alive() for p in clock._processes.values())


def test_a_question_to_a_killed_executor_is_an_executor_lost_not_a_broken_pipe() -> None:
    """Killed between two questions (its sentinel maybe not yet seen by the router): asking it is the
    same loss whichever finds it first — ExecutorLost, which the learner restarts, never a bare
    BrokenPipeError (a learner failure). Repeated: the router and the send race."""
    units = tiny_units()
    for _ in range(3):
        clock = ProcessClock(units, setup_for(make_plan(1, 2, num_units=3)), ProcessSettings(lr=0.01)).start()
        try:
            clock.usage()
            victim = clock._processes[(1, 0)]
            os.kill(victim.pid, signal.SIGKILL)
            victim.join(5)
            with pytest.raises(ExecutorLost, match="worker 1"):
                clock.usage()
        finally:
            clock.close(reraise=False)


@pytest.mark.parametrize("recompute", [False, True])
def test_one_worker_over_three_stage_processes_equals_the_plain_sgd_loop(recompute: bool) -> None:
    """Transparency across processes: P stages in P processes exchanging activations and gradients over
    torch.distributed (gloo), one worker, no staleness (each item trained before the next arrives)."""
    units, items = tiny_units(), stream(20)
    plan = make_plan(3, 1, num_units=3, recompute=recompute)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)) as clock:
        assert sorted(clock._processes) == [(0, 0), (0, 1), (0, 2)]
        sequentially(clock, items)
        stages = plan.partition.stages
        state = {  # stage-local names ("0.0.weight": the stage's first unit) to the model's
            f"{stages[j][int(k.split('.', 1)[0])]}.{k.split('.', 1)[1]}": v
            for j, tensors in enumerate(clock.master_state())
            for k, v in tensors.items()
        }
        clock.validate()
        assert clock.counters.trained == 20 and clock.counters.updates[0] == [20, 20, 20]
    reference = plain_sgd(units, items, 0.05)
    assert_close(state, {k: reference[k] for k in state}, **EXACT)


def test_two_workers_over_two_stage_processes_pipeline_and_validate() -> None:
    """2 × 2 executors in 4 processes, 1F1B with weight stashing under a saturating stream, T3 omission on
    one worker: every item accounted for, the executed trace valid across ranks."""
    units, items = tiny_units(), stream(200)
    plan = make_plan(2, 2, num_units=3, omission=[[1, 0], [0, 0]])
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)) as clock:
        arrivals = [clock.submit(item.x, item.y) for item in items]
        clock.drain(timeout=60)
        c = clock.counters
        assert c.items == 200 and c.trained_any_stage + sum(c.skipped.values()) == 200
        assert c.trained < c.trained_any_stage  # worker 0 omits stage 0's backward for every other item
        assert {a.worker for a in arrivals if a.skipped is None} == {0, 1}
        clock.validate()
        assert [sum(stage.readers()) for stage in clock.stages] == [2, 2]  # only the replicas are pinned


@pytest.mark.parametrize("compensator", COMPENSATOR_NAMES)
def test_every_compensator_is_accepted_including_those_that_fold_every_update(compensator: str) -> None:
    plan = make_plan(1, 2, num_units=3)
    # gap-aware's C and iter-fisher's ring are shared per stage (.average, .deltas); the others need no deltas
    ProcessClock(tiny_units(), setup_for(plan), ProcessSettings(compensator=compensator))


def test_removed_workers_get_no_process_and_their_items_are_skipped() -> None:
    plan = make_plan(1, 2, num_units=3, live=[True, False])
    with ProcessClock(tiny_units(), setup_for(plan), ProcessSettings(lr=0.05)) as clock:
        assert list(clock._processes) == [(0, 0)]
        arrivals = [clock.submit(item.x, item.y) for item in stream(10)]
        clock.drain(timeout=30)
    assert all(a.skipped is not None and a.skipped.value == "worker_removed" for a in arrivals if a.index % 2 == 1)


def test_closing_is_not_an_executor_failure() -> None:
    """Executors exit when the clock closes; the router must not take that for a death (it raced once)."""
    units, items = tiny_units(), stream(6)
    plan = make_plan(1, 2, num_units=3)
    for _ in range(10):
        with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)) as clock:
            for item in items:
                clock.submit(item.x, item.y)
            clock.drain(timeout=30)
        assert all(not p.is_alive() for p in clock._processes.values())


def test_a_batch_is_predicted_on_one_version_and_dispatched_in_order() -> None:
    units, items = tiny_units(), stream(8)
    plan = make_plan(1, 2, num_units=3)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05)) as clock:
        single = [clock.submit(item.x, None) for item in items]  # unlabelled: predicted, never trained
        batch = clock.submit_many([item.x for item in items], [None] * len(items))
        clock.drain(timeout=30)
    assert [a.index for a in batch] == list(range(8, 16)) and {a.version for a in batch} == {0}
    assert [a.prediction for a in batch] == [a.prediction for a in single]
    assert all(a.skipped is not None and a.skipped.value == "no_label" for a in batch)


def test_a_model_with_many_tensors_starts_and_trains() -> None:
    """ResNet-18's 62 parameter tensors in K slots each once took one shared-memory handle per tensor,
    more than a forkserver passes to a new process; the slots now share one buffer per dtype."""
    from ferret_core.zoo import build_model

    model = build_model("resnet18", seed=0)
    units = list(model.units)
    plan = make_plan(1, 2, num_units=len(units))
    gen = torch.Generator().manual_seed(0)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.01)) as clock:
        for _ in range(2):
            clock.submit(torch.randn(*model.input_shape, generator=gen), 3)
            clock.drain(timeout=60)
        assert clock.counters.trained == 2


def test_a_replan_removes_and_brings_back_a_worker_keeping_the_processes() -> None:
    units, items = tiny_units(), stream(60)
    two = make_plan(1, 2, num_units=3)
    one = make_plan(1, 2, num_units=3, live=[True, False])
    with ProcessClock(units, setup_for(two), ProcessSettings(lr=0.05)) as clock:
        kept = clock._processes[(0, 0)].pid
        sequentially(clock, items[:10])
        clock.validate()
        clock.replan(setup_for(one))
        assert list(clock._processes) == [(0, 0)] and clock._processes[(0, 0)].pid == kept
        arrivals = []
        for item in items[10:30]:
            arrivals.append(clock.submit(item.x, item.y))
            clock.drain(timeout=30)
        assert all((a.skipped is None) == (a.index % 2 == 0) for a in arrivals)
        assert all(a.skipped.value == "worker_removed" for a in arrivals if a.skipped is not None)
        assert sum(clock.stages[0].readers()) == 1  # the retired worker let go of its replica
        clock.replan(setup_for(two))
        assert sorted(clock._processes) == [(0, 0), (1, 0)] and clock._processes[(0, 0)].pid == kept
        sequentially(clock, items[30:])
        c = clock.counters
        assert c.items == 60 and c.trained == 50 and c.skipped["worker_removed"] == 10
        assert clock.stages[0].current_version() == 50
        with pytest.raises(NotImplementedError, match="before replan"):
            clock.validate()


def test_a_replan_changes_accumulation_on_the_running_executor() -> None:
    units, items = tiny_units(), stream(20)
    with ProcessClock(units, setup_for(make_plan(1, 1, num_units=3)), ProcessSettings(lr=0.05)) as clock:
        sequentially(clock, items[:10])
        clock.replan(setup_for(make_plan(1, 1, num_units=3, accumulation=2)))
        sequentially(clock, items[10:])
        assert clock.counters.trained == 20 and clock.counters.updates[0] == [15]


def test_a_replan_that_needs_new_executors_is_refused_with_what_to_do() -> None:
    units = tiny_units()
    one_stage = ProcessClock(units, setup_for(make_plan(1, 2, num_units=3)), ProcessSettings(lr=0.05))
    with one_stage, pytest.raises(ValueError, match="start one for the new plan"):
        one_stage.replan(setup_for(make_plan(3, 2, num_units=3)))
    two_stages = ProcessClock(units, setup_for(make_plan(2, 2, num_units=3)), ProcessSettings(lr=0.05))
    with two_stages, pytest.raises(NotImplementedError, match="gloo group"):
        two_stages.replan(setup_for(make_plan(2, 2, num_units=3, live=[True, False])))


def test_a_worker_brought_back_by_a_replan_is_watched_like_the_others() -> None:
    """Its process is new: its death must still stop the clock (the router follows the processes a
    re-plan starts and forgets the ones it retires)."""
    units, items = tiny_units(), stream(20)
    two = make_plan(1, 2, num_units=3)
    clock = ProcessClock(units, setup_for(two), ProcessSettings(lr=0.05)).start()
    try:
        sequentially(clock, items[:4])
        clock.replan(setup_for(make_plan(1, 2, num_units=3, live=[True, False])))
        clock.replan(setup_for(two))
        os.kill(clock._processes[(1, 0)].pid, signal.SIGKILL)
        deadline = time.perf_counter() + 5.0
        with pytest.raises(ScheduleError, match="worker 1"):
            while time.perf_counter() < deadline:
                clock.submit(items[5].x, items[5].y)
                time.sleep(0.01)
    finally:
        clock.close(reraise=False)
    assert all(not p.is_alive() for p in clock._processes.values())


def _hold(lock: Any, conn: Any) -> None:
    lock.acquire()
    conn.send("holding")
    time.sleep(60)


def test_a_prediction_does_not_wait_forever_for_a_lock_a_killed_process_held() -> None:
    """kill -9 between an acquire and its release leaves a cross-process lock held for good; the
    coordinator stops waiting for it once the clock knows an executor died, and raises that death."""
    import torch.multiprocessing as tmp

    units, items = tiny_units(), stream(4)
    clock = ProcessClock(units, setup_for(make_plan(1, 1, num_units=3)), ProcessSettings(lr=0.05)).start()
    ctx = tmp.get_context("forkserver")
    parent, child = ctx.Pipe()
    holder = ctx.Process(target=_hold, args=(clock.stages[0].lock, child), daemon=True)
    holder.start()
    try:
        assert parent.recv() == "holding"
        os.kill(holder.pid, signal.SIGKILL)
        raised: list[BaseException] = []

        def predict() -> None:
            try:
                clock.submit(items[0].x, items[0].y)
            except BaseException as exc:
                raised.append(exc)

        waiting = threading.Thread(target=predict)
        waiting.start()
        time.sleep(0.3)
        assert waiting.is_alive() and not raised  # the prediction waits for the dead holder's lock
        os.kill(clock._processes[(0, 0)].pid, signal.SIGKILL)
        waiting.join(5.0)
        assert not waiting.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], ScheduleError) and "worker 0" in str(raised[0])
    finally:
        clock.close(reraise=False)
        holder.join(5)
