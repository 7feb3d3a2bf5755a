"""The trainer's learner on executor processes (services/trainer/process_learner.py) through the
:class:`~services.trainer.learner.Learner` contract: predictions and dispatch of a queued batch, the
counts, re-plans on the same processes (T1–T3) and on a new clock (T4: slots sized for the live workers,
measured ≤ planned, the compensators' state carried on), snapshot tensors that restore the same predictions
and a snapshot's compensator state that restores λ, and an executor's death reported as the learner's
failure."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import pytest
import torch

from ferret_core.engine import SkipReason
from ferret_core.plan import Plan
from ferret_core.planning.planner import Planner
from services.config import Settings, load_settings
from services.trainer.executors import ExecutorChoice
from services.trainer.learner import LearnerFailed
from services.trainer.process_learner import ProcessLearner
from services.trainer.runner import build_zoo_model, load_profile, make_planner

pytestmark = pytest.mark.integration

SHAPE = (1, 8, 8)  # digits


def _settings(**extra: str) -> Settings:
    env = {
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": "mlp",
        "FERRET_TRAINER_EXECUTORS": "processes",
        "FERRET_TRAINER_STREAM_RATE": "20000",  # faster than one worker: the planner wants two
        "FERRET_TRAINER_MAX_WORKERS": "2",  # allowed two (the default leaves a core to the record path)
        "FERRET_TRAINER_LR": "0.05",
        **{f"FERRET_TRAINER_{k.upper()}": v for k, v in extra.items()},
    }
    return load_settings(None, env=env)


def _learner(**extra: str) -> tuple[ProcessLearner, Plan, Planner]:
    settings = _settings(**extra)
    model = build_zoo_model(settings)
    profile = load_profile(settings, model)
    planner = make_planner(settings, profile, ExecutorChoice("processes", "test", configured=True))
    plan = planner.plan(None)
    return ProcessLearner(model, plan, settings, profile), plan, planner


def _items(n: int, seed: int = 0) -> list[tuple[torch.Tensor, int]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(SHAPE, generator=gen), int(torch.randint(0, 10, (), generator=gen))) for _ in range(n)]


def test_a_queued_batch_is_predicted_together_and_every_item_gets_one_outcome() -> None:
    learner, plan, _ = _learner()
    try:
        assert plan.live_workers == 2
        items = _items(40)
        waits = [learner.submit(i, x, y) for i, (x, y) in enumerate(items)]
        outcomes = [wait() for wait in waits]
        learner.drain(30)
        assert all(o.dispatched != (o.skipped is not None) for o in outcomes)
        assert all(o.worker == i % 2 for i, o in enumerate(outcomes) if o.dispatched)
        assert len({o.model_version for o in outcomes}) == 1  # one forward pass, one master version
        unlabelled = learner.submit(40, items[0][0], None)()
        assert unlabelled.skipped is SkipReason.NO_LABEL
        stats = learner.stats()
        assert stats.backward_passes == sum(o.dispatched for o in outcomes)
        assert stats.model_version == stats.backward_passes
        assert 0 < stats.measured_bytes <= stats.planned_bytes
        # the executors' own tensors (gradients, activations) on top of the shared slots, counted once
        assert stats.measured_bytes == stats.peak_bytes == learner.clock.measured_bytes() > learner.clock.shared_bytes()
        assert set(learner.clock.executor_bytes()) == {(0, 0), (1, 0)}
    finally:
        learner.close()


def test_iter_fisher_trains_two_worker_processes_over_the_shared_delta_ring() -> None:
    learner, plan, _ = _learner(compensator="iter-fisher")
    try:
        assert plan.live_workers == 2
        for burst in range(3):
            waits = [learner.submit(burst * 20 + i, x, y) for i, (x, y) in enumerate(_items(20, seed=burst))]
            for wait in waits:
                wait()
            learner.drain(30)
        stats = learner.stats()
        store = learner.clock.deltas[0]
        assert store is not None and store.pushed == stats.model_version == stats.backward_passes > 0
        assert 0 < stats.measured_bytes <= stats.planned_bytes  # the shared ring included, counted once
        # the shared ring and slots once, plus each executor's own (its λ, v_r, v_a, gradients, activations)
        assert stats.measured_bytes == learner.clock.shared_bytes() + sum(learner.clock.executor_bytes().values())
        assert store.nbytes() > 0 and learner.clock.shared_bytes() > sum(s.nbytes() for s in learner.clock.stages)
    finally:
        learner.close()


def test_replans_keep_the_processes_for_t1_to_t3_and_start_a_clock_for_t4() -> None:
    learner, plan, planner = _learner()
    try:
        for i, (x, y) in enumerate(_items(20)):
            learner.submit(i, x, y)()
        learner.drain(30)
        before = learner.stats().model_version
        pids = sorted(p.pid for p in learner.clock._processes.values())
        learner.apply_plan(replace(plan, workers=tuple(replace(w, recompute=True) for w in plan.workers)))
        assert learner.replans_kept == 1 and sorted(p.pid for p in learner.clock._processes.values()) == pids
        smaller = planner.plan(plan.min_feasible_bytes)
        assert smaller.live_workers < plan.live_workers
        learner.apply_plan(smaller)
        assert learner.replans_rebuilt == 1 and learner.plan == smaller
        for i, (x, y) in enumerate(_items(20, seed=1), start=20):
            learner.submit(i, x, y)()
        learner.drain(30)
        stats = learner.stats()
        assert stats.model_version > before  # the count carries across clocks
        assert stats.measured_bytes <= smaller.planned_bytes
        assert stats.peak_bytes >= stats.measured_bytes
    finally:
        learner.close()


def test_snapshot_tensors_restore_the_same_predictions_on_a_new_learner() -> None:
    first, _, _ = _learner()
    items = _items(30)
    try:
        for i, (x, y) in enumerate(items):
            first.submit(i, x, y)()
        first.drain(30)
        tensors = first.state_tensors()
        compensators = first.compensator_state()  # the stages' shared state, as a snapshot keeps it
        probe = [first.submit(100 + k, x, None)() for k, (x, _) in enumerate(items[:5])]
    finally:
        first.close()
    second, _, _ = _learner()
    try:
        second.load_state_tensors(tensors)
        again = [second.submit(100 + k, x, None)() for k, (x, _) in enumerate(items[:5])]
        assert [o.predicted_class for o in again] == [o.predicted_class for o in probe]
        assert [o.confidence for o in again] == pytest.approx([o.confidence for o in probe])
        assert second.stats().model_version == int(tensors["engine.updates"])
        fresh = second.compensator_state()
        second.load_compensator_state(compensators)
        restored = second.compensator_state()
        assert compensators[0]["lambda"] != fresh[0]["lambda"]  # λ was tuned by the first learner's workers...
        assert restored[0]["lambda"] == compensators[0]["lambda"]  # ... and the new executors start from it
        for key in ("v_r", "v_a"):
            assert all(torch.equal(a, b) for a, b in zip(restored[0][key], compensators[0][key], strict=True))
    finally:
        second.close()


def _kill_an_executor(learner: ProcessLearner) -> None:
    os.kill(next(iter(learner.clock._processes.values())).pid, signal.SIGKILL)


def test_a_killed_executor_is_restarted_in_place_and_the_stream_goes_on() -> None:
    learner, _, _ = _learner()
    try:
        items = _items(200)
        for i, (x, y) in enumerate(items[:40]):
            learner.submit(i, x, y)()
        learner.drain(30)
        tensors = learner.state_tensors()  # a snapshot: the last good weights
        before = learner.stats().model_version
        _kill_an_executor(learner)
        outcomes = []
        deadline = time.perf_counter() + 10.0
        i = 40
        while learner.executor_restarts == 0:  # arrivals keep coming; one of them meets the dead executor
            assert time.perf_counter() < deadline, "the death was not noticed within 10 s"
            outcomes.append(learner.submit(i, *items[i % 200])())
            i += 1
            time.sleep(0.005)
        outcomes += [learner.submit(j, *items[j % 200])() for j in range(i, i + 40)]
        learner.drain(30)
        assert all(o.dispatched != (o.skipped is not None) for o in outcomes)  # one outcome each
        assert learner.recovery_seconds[0] < 5.0
        assert learner.stats().model_version > before  # trains on
        assert int(tensors["engine.updates"]) == before
    finally:
        learner.close()


def test_executors_that_keep_dying_stop_the_learner() -> None:
    learner, _, _ = _learner()
    try:
        with pytest.raises(LearnerFailed, match="ExecutorLost"):
            for i, (x, y) in enumerate(_items(100_000)):
                if learner.executor_restarts == len(learner._deaths) and i % 20 == 0:
                    _kill_an_executor(learner)
                learner.submit(i, x, y)()
                time.sleep(0.002)
        assert learner.executor_restarts == 3
    finally:
        learner.clock.close(reraise=False)


def test_the_compensator_settings_reach_every_executor_process() -> None:
    """``trainer.compensator_settings`` builds the executors' compensators (DC-ASGD-a reports its λ₀)."""
    learner, plan, _ = _learner(compensator="dc-asgd-a", compensator_settings="{dc_lambda0: 3, dc_bound: 0.5}")
    try:
        assert plan.live_workers == 2
        waits = [learner.submit(i, x, y) for i, (x, y) in enumerate(_items(40))]
        assert all(wait() is not None for wait in waits)
        learner.drain(30)
        reports = learner.clock.compensations()
        assert len(reports) == 2 and all(r.stats["lambda"] == 3.0 for r in reports)  # the default λ₀ is 10
    finally:
        learner.close()


def test_the_executor_processes_keep_freed_memory_as_the_trainer_is_configured() -> None:
    for setting, expected in (("true", True), ("false", False)):
        learner, _, _ = _learner(retain_freed_memory=setting)
        try:
            usages = learner.clock.usage()
            assert len(usages) == 2
            assert [u.heap_retained for u in usages] == [expected, expected], setting
        finally:
            learner.close()
