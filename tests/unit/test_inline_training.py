"""Inline training (``trainer.training_thread``): the wall clock's executors' actions run on the
caller's thread, one per ``train_step``, with the same scheduler, admission and actions as the executor
threads: the same predictions, dispatch and weights; nothing trains until the caller asks; a failure is
kept and raised as a thread's is; the trainer's loop polls without waiting while training is pending."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from ferret_core.engine import EngineSettings, FerretPolicy, StreamEngine
from ferret_core.engine.wall_clock import WallClock
from ferret_core.errors import FerretError
from tests.unit.test_engine_support import make_plan, stream, tiny_units


def _engine(stages: int = 1, workers: int = 1, end_of_action: Callable[[], None] | None = None) -> StreamEngine:
    units = tiny_units(num_units=2)
    return StreamEngine(
        units,
        FerretPolicy(make_plan(stages, workers, num_units=2)).setup("tiny", len(units), 0.0),
        EngineSettings(keep_trace=False, validate=False),
        end_of_action=end_of_action,
    )


def _masters(engine: StreamEngine) -> list[torch.Tensor]:
    return [t.clone() for v in engine.masters() for t in v.params]


@pytest.mark.parametrize(("stages", "workers"), [(1, 1), (2, 2)], ids=["1x1", "2x2"])
def test_inline_training_trains_as_the_executor_threads_do(stages: int, workers: int) -> None:
    """Drained after every item (one order of updates): the same predictions, dispatch and final weights,
    bit for bit, whether executor threads or the caller's ``drain`` run the actions."""
    results = []
    for inline in (False, True):
        torch.manual_seed(0)
        engine = _engine(stages, workers)
        with engine.wall_clock(inline_predictions=True, inline_training=inline) as clock:
            arrivals = []
            for item in stream(16):
                arrivals.append(clock.outcome(clock.submit(item.x, item.y), timeout=30))
                clock.drain(timeout=60)
        results.append(([(a.prediction, a.skipped, a.worker, a.version) for a in arrivals], _masters(engine)))
    assert results[0][0] == results[1][0]
    assert any(skipped is None for _, skipped, _, _ in results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


def test_nothing_trains_until_the_caller_steps() -> None:
    engine = _engine()
    before = {t.name for t in threading.enumerate()}
    with engine.wall_clock(inline_training=True) as clock:
        assert clock.inline_predictions  # one thread does both
        started = {t.name for t in threading.enumerate()} - before
        assert not any(name.startswith("ferret-") for name in started)  # no executor, no prediction thread
        assert not clock.pending_training() and not clock.train_step()  # idle: nothing to run
        item = stream(1)[0]
        arrival = clock.outcome(clock.submit(item.x, item.y), timeout=30)
        assert arrival.skipped is None and arrival.worker == 0
        weights = _masters(engine)
        assert clock.pending_training()
        assert all(torch.equal(a, b) for a, b in zip(weights, _masters(engine), strict=True))  # not yet
        actions = 0
        while clock.train_step():  # forward, then backward (and its update)
            actions += 1
        assert actions == 2 and not clock.pending_training()
        assert not all(torch.equal(a, b) for a, b in zip(weights, _masters(engine), strict=True))
        assert clock.measured_service_times()[0] is None or clock.measured_service_times()[0] > 0


def test_executor_threads_ignore_train_step() -> None:
    engine = _engine()
    with engine.wall_clock(inline_predictions=True) as clock:
        item = stream(1)[0]
        clock.outcome(clock.submit(item.x, item.y), timeout=30)
        assert not clock.pending_training() and not clock.train_step()  # the threads train by themselves
        clock.drain(timeout=60)


def test_a_failed_action_is_raised_then_kept_for_the_next_call() -> None:
    def broken() -> None:
        raise RuntimeError("backward failed")

    engine = _engine(end_of_action=broken)
    clock = engine.wall_clock(inline_training=True).start()
    item = stream(1)[0]
    clock.outcome(clock.submit(item.x, item.y), timeout=30)
    with pytest.raises(RuntimeError, match="backward failed"):
        clock.train_step()
    assert engine.failed_item == 0
    assert not clock.pending_training()  # stopped: the loop does not spin on it
    with pytest.raises(RuntimeError, match="backward failed"):  # as an executor thread's failure is
        clock.submit(item.x, item.y)
    with pytest.raises(RuntimeError, match="backward failed"):
        clock.drain(timeout=5)
    clock.close(reraise=False)


def test_run_stream_trains_between_arrivals() -> None:
    engine = _engine()
    with engine.wall_clock(inline_training=True) as clock:
        clock.run_stream(stream(10), arrival_interval=0.002)
        assert not clock.pending_training()
    assert engine.stats().updates >= 1


def test_inline_training_refuses_cuda_stages() -> None:
    engine = _engine()
    engine.pipeline._devices = [torch.device("cuda", 0)]
    with pytest.raises(FerretError, match="CPU stages only"):
        WallClock(engine.pipeline, inline_training=True)


@pytest.mark.parametrize(
    ("setting", "workers", "stages", "on_loop"),
    [
        ("auto", 1, 1, True),  # one executor on the CPU: the loop trains
        ("auto", 2, 1, False),  # several executors: a thread each
        ("auto", 1, 2, False),
        ("loop", 2, 1, True),
        ("executors", 1, 1, False),
    ],
)
def test_the_trainer_picks_the_thread_that_trains(setting: str, workers: int, stages: int, on_loop: bool) -> None:
    from services.config import load_settings
    from services.trainer.engine_learner import EngineLearner
    from services.trainer.runner import build_zoo_model

    settings = load_settings(
        None,
        env={
            "FERRET_TRAINER_DATASET": "digits",
            "FERRET_TRAINER_MODEL": "mlp",
            "FERRET_TRAINER_TRAINING_THREAD": setting,
        },
    )
    model = build_zoo_model(settings)
    learner = EngineLearner(model, make_plan(stages, workers, num_units=model.num_units), settings)
    try:
        assert learner.clock.inline_training is on_loop
        assert not learner.pending_training() and not learner.train_step()  # nothing admitted yet
    finally:
        learner.close()


def test_the_loop_cannot_train_cuda_stages() -> None:
    from services.config import SettingsError, load_settings

    with pytest.raises(SettingsError, match="training_thread"):
        load_settings(None, env={"FERRET_TRAINER_TRAINING_THREAD": "loop", "FERRET_TRAINER_DEVICE": "cuda"})


def test_train_until_trains_what_is_ready_and_stops_at_the_deadline() -> None:
    import time

    engine = _engine()
    with engine.wall_clock(inline_training=True) as clock:
        for item in stream(3):
            clock.outcome(clock.submit(item.x, item.y), timeout=30)
        clock.train_until(time.perf_counter() - 1.0)  # already past: nothing runs
        assert clock.pending_training()
        clock.train_until(time.perf_counter() + 60.0)  # returns once nothing is ready, long before the deadline
        assert not clock.pending_training()
    with engine.wall_clock() as threads:  # executor threads: a no-op
        threads.train_until(time.perf_counter() + 60.0)
