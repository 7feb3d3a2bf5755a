"""Every method of the engine's registry, live on the real broker (docs/service.md "Methods live"): N items
give N predictions with the decisions the method makes, and a budget change re-plans the methods that
plan for a budget and is refused (FAILED_PRECONDITION, plan unchanged) by the others."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from ferret_core.data import dataset_spec
from ferret_core.engine import METHOD_NAMES
from ferret_core.profile import ModelProfile
from services.config import Settings
from services.control.client import ControlCallError, ControlClient
from services.control.server import create_server
from services.kafka.admin import TopicNames, ensure_topics
from services.kafka.record_codec import SampleDecoder
from services.trainer.engine_learner import EngineLearner
from services.trainer.live_methods import FixedPlan, plans_for_budget
from services.trainer.runner import TrainerParts, assemble, build_zoo_model, load_profile, make_planner

from .trainer_support import produce_digits, read_predictions, settings_for

pytestmark = pytest.mark.integration
ITEMS = 60


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelProfile]:
    """One profile of the digits MLP for every method (profiling is not what these tests are about)."""
    settings = settings_for("127.0.0.1:1", "redis://127.0.0.1:1/0", "p", FERRET_TRAINER_MODEL="mlp")
    yield load_profile(settings, build_zoo_model(settings))


def wait_for(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@contextmanager
def streaming(parts: TrainerParts) -> Iterator[list[BaseException]]:
    """The trainer's record stream running on a thread; stopped (drain, snapshot, commit) and joined on exit.
    Yields the list the stream's exception, if any, is put in."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            parts.stream.run(stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(60)


def method_settings(bootstrap: str, redis_url: str, prefix: str, method: str) -> Settings:
    return settings_for(
        bootstrap,
        redis_url,
        prefix,
        FERRET_TRAINER_METHOD=method,
        FERRET_TRAINER_MODEL="mlp",
        FERRET_TRAINER_MAX_WORKERS="2",
        FERRET_TRAINER_COMPENSATOR="iter-fisher",
    )


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_every_method_runs_live(
    method: str, bootstrap_servers: str, redis_url: str, topic_prefix: str, mlp_profile: ModelProfile
) -> None:
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    settings = method_settings(bootstrap_servers, redis_url, topic_prefix, method)
    planner = make_planner(settings, mlp_profile)
    learner = EngineLearner(build_zoo_model(settings), planner.plan(None), settings, mlp_profile)
    parts = assemble(settings, learner, SampleDecoder(*dataset_spec(settings.trainer.dataset)), None)
    budgeted = plans_for_budget(method)
    control = create_server(planner if budgeted else FixedPlan(method), parts.port).start()
    topics = TopicNames(topic_prefix)
    client = ControlClient(control.target)
    try:
        with streaming(parts) as errors:
            ids = produce_digits(bootstrap_servers, topics.samples, ITEMS // 2, spacing_ms=10)
            wait_for(lambda: parts.port.status().predictions_published >= ITEMS // 2)
            plan_before = client.get_plan()
            if budgeted:
                # the planner's own bytes (they count the admission queue; a schedule's planned bytes do not yet)
                applied = client.set_memory_budget(planner.plan(None).planned_bytes)
                assert applied.plan_version == plan_before.plan_version + 1
            else:
                with pytest.raises(ControlCallError) as refused:
                    client.set_memory_budget(2**30)
                assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
                assert "does not plan for a memory budget" in refused.value.details
                assert client.get_plan() == plan_before  # unchanged
            rest = ITEMS - ITEMS // 2
            ids += produce_digits(bootstrap_servers, topics.samples, rest, start=ITEMS // 2, spacing_ms=10)
            wait_for(lambda: parts.port.status().predictions_published >= ITEMS)
    finally:
        client.close()
        control.stop(grace_s=1)
    assert not errors, errors
    predictions = read_predictions(bootstrap_servers, topics.predictions, ITEMS)
    assert sorted(p.sample_id for p in predictions) == sorted(ids)  # N items → N predictions
    status = parts.port.status()
    assert status.items_valid == ITEMS and status.items_dispatched + sum(status.skipped.values()) == ITEMS
    decisions = Counter(p.decision for p in predictions)
    assert sum(decisions.values()) == ITEMS
    dispatched = [p for p in predictions if p.worker >= 0]
    assert len(dispatched) == status.items_dispatched > 0
    if method == "oracle":  # every item trained, in order, on the one worker
        assert status.items_dispatched == ITEMS and not status.skipped
        assert status.backward_passes == ITEMS  # the shutdown drained the queue
        assert {p.worker for p in predictions} == {0}
    elif method == "1-skip":  # trained only if free at arrival, else busy
        assert set(status.skipped) <= {"busy"} and {p.worker for p in dispatched} == {0}
    elif method == "ferret":
        assert set(status.skipped) <= {"busy", "worker_removed"}
        workers = parts.port.current_plan()[0].num_workers  # the re-plan asked for the same bytes: same plan
        assert all(p.worker == p.item % workers for p in dispatched)  # the engine's own dispatch


@pytest.mark.parametrize("thread", ["loop", "executors"])
def test_either_training_thread_trains_every_item_live(
    thread: str, bootstrap_servers: str, redis_url: str, topic_prefix: str, mlp_profile: ModelProfile
) -> None:
    """``trainer.training_thread`` (docs/service.md "Which thread trains"): Oracle's 1 × 1 plan on the
    record path's thread or on an executor thread of its own: every item predicted once, every item
    trained (backward passes = items), model versions that never go back, and the thread it asked for."""
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=1)
    before = {t.name for t in threading.enumerate()}
    settings = settings_for(
        bootstrap_servers, redis_url, topic_prefix,
        FERRET_TRAINER_METHOD="oracle", FERRET_TRAINER_MODEL="mlp", FERRET_TRAINER_TRAINING_THREAD=thread,
    )  # fmt: skip
    learner = EngineLearner(build_zoo_model(settings), make_planner(settings, mlp_profile).plan(None), settings)
    assert learner.clock.inline_training == (thread == "loop")
    parts = assemble(settings, learner, SampleDecoder(*dataset_spec(settings.trainer.dataset)), None)
    topics = TopicNames(topic_prefix)
    with streaming(parts) as errors:
        ids = produce_digits(bootstrap_servers, topics.samples, ITEMS, spacing_ms=2)
        wait_for(lambda: parts.port.status().predictions_published >= ITEMS)
        wait_for(lambda: parts.port.status().backward_passes >= ITEMS)  # trained between later polls
        started = {t.name for t in threading.enumerate()} - before
        assert ("ferret-w0s0" in started) == (thread == "executors")  # an executor thread, or none
    assert not errors, errors
    predictions = read_predictions(bootstrap_servers, topics.predictions, ITEMS)
    assert sorted(p.sample_id for p in predictions) == sorted(ids)
    status = parts.port.status()
    assert status.items_dispatched == ITEMS and not status.skipped and status.backward_passes == ITEMS
    by_item = sorted(predictions, key=lambda p: p.item)
    assert all(a.model_version <= b.model_version for a, b in itertools.pairwise(by_item))
