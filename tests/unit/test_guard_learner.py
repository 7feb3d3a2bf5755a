"""GuardedLearner (services/trainer/guard/learner.py) around a fake inner learner whose weights the test
sets: a live model made clearly worse is rolled back to the last-good weights (the model version in the
outcomes goes back), equal models are not, concept drift that hurts both is detected and not rolled back,
and the events reach ``<prefix>.events`` through the record path with their stream position."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ferret_core.plan import Plan
from ferret_core.zoo import ZooModel
from services.config import load_settings
from services.config.sections import GuardSettings
from services.kafka.record_codec import SampleDecoder, encode_sample
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.guard.learner import GuardedLearner
from services.trainer.learner import ArrivalOutcome, LearnerStats, settled
from services.trainer.lineage import Lineage
from services.trainer.runner import assemble
from tests.unit.test_engine_support import make_plan
from tests.unit.test_trainer_stream import FakeConsumer, FakeMessage, FakeProducer

GOOD = torch.tensor([[-1.0, 0.0], [1.0, 0.0]])  # class 1 iff x[0] > 0: right on every clean item


def linear_model() -> ZooModel:
    unit = nn.Linear(2, 2)
    with torch.no_grad():
        unit.weight.copy_(GOOD)
        unit.bias.zero_()
    return ZooModel("linear", (unit,), (2,), 2)


class FakeLearner:
    """The Learner contract over a live copy of the model; ``train`` advances the version (a stand-in for
    optimizer updates), ``set_weight`` is what the test does to the live model."""

    def __init__(self, model: ZooModel) -> None:
        self.net = copy.deepcopy(model.units[0])
        self.version = 0
        self.lineage = Lineage()
        self.loaded = 0
        self.compensators: list[Sequence[Mapping[str, Any]]] = []  # what load_compensator_state was given

    @property
    def plan(self) -> Plan:
        return make_plan(1, 1, num_units=1)

    def set_weight(self, weight: torch.Tensor) -> None:
        with torch.no_grad():
            self.net.weight.copy_(weight)

    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        return self.submit(item, x, y, event_time_ms)()

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        with torch.no_grad():
            p = torch.softmax(self.net(x.reshape(1, -1))[0], 0)
        c = int(p.argmax())
        outcome = ArrivalOutcome(c, float(p[c]), self.version, None, 0, model_lineage=self.lineage.value)
        self.version += 1  # trained on it
        return settled(outcome)

    def pending_training(self) -> bool:
        return False

    def train_step(self) -> bool:
        return False

    def measured_service_times(self) -> list[float | None]:
        return [None]

    def drain(self, timeout: float | None = None) -> None: ...

    def apply_plan(self, plan: Plan) -> None: ...

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {
            "model.0.weight": self.net.weight.detach(),
            "model.0.bias": self.net.bias.detach(),
            "engine.updates": torch.tensor(self.version),
        }

    def master_tensors(self) -> dict[str, torch.Tensor]:
        return self.state_tensors()

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self.net.weight.copy_(tensors["model.0.weight"])
            self.net.bias.copy_(tensors["model.0.bias"])
        self.version = int(tensors["engine.updates"])
        self.lineage.branch()  # as the real learners: a load begins a new lineage
        self.loaded += 1

    def compensator_state(self) -> list[dict[str, Any]]:
        return [{"name": "fresh", "version": self.version}]

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        self.compensators.append(states)

    def stats(self) -> LearnerStats:
        return LearnerStats(
            backward_passes=self.version,
            model_version=self.version,
            measured_bytes=0,
            peak_bytes=0,
            model_lineage=self.lineage.value,
        )

    def close(self) -> None: ...


def items(n: int, seed: int, noise: float = 0.0, permute: bool = False) -> list[tuple[torch.Tensor, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        x = torch.tensor([rng.uniform(-1, 1), rng.uniform(-1, 1)])
        y = int(x[0] > 0)
        if rng.random() < noise:
            y = 1 - y
        out.append((x, 1 - y if permute else y))
    return out


def guarded(**overrides: Any) -> tuple[GuardedLearner, FakeLearner]:
    model = linear_model()
    inner = FakeLearner(model)
    settings = GuardSettings(**{"window": 50, "probation_items": 100, **overrides})
    return GuardedLearner(inner, model, settings), inner


def feed(learner: GuardedLearner, data: list[tuple[torch.Tensor, int]], start: int) -> list[ArrivalOutcome]:
    return [learner.arrive(start + i, x, y) for i, (x, y) in enumerate(data)]


def test_a_clearly_worse_live_model_is_rolled_back_and_its_version_goes_back() -> None:
    learner, inner = guarded(probation_items=50)
    feed(learner, items(200, seed=1), 0)  # live as good as the shadow: promoted one window late + probation
    last_good = learner.stats().guard
    assert last_good is not None and last_good.promotions >= 2 and last_good.rollbacks == 0
    inner.set_weight(-GOOD)  # poisoned: wrong on every item the shadow gets right
    poisoned_version = inner.version
    outcomes = feed(learner, items(200, seed=2), 200)
    stats = learner.stats().guard
    assert stats is not None and stats.rollbacks == 1
    rolled = [e for e in learner.take_events() if e.kind == "rollback"]
    assert len(rolled) == 1
    event = rolled[0]
    assert event.previous_model_version == poisoned_version + event.item - 200 + 1 > event.model_version
    assert event.item - 200 < 30  # h = 9.2 nats at ln(1.5) a shadow win: 23 discordant items
    after = [o for i, o in enumerate(outcomes) if 200 + i > event.item]
    assert after and after[0].model_version == event.model_version < poisoned_version  # predictions go back
    assert all(o.predicted_class == y for o, (_, y) in zip(after, items(200, seed=2)[-len(after) :], strict=True))
    # the compensators' state goes back to the start's with the weights (no λ learnt from the dropped ones)
    assert inner.compensators == [[{"name": "fresh", "version": 0}]]
    assert "compensator state reset to the start's" in event.detail


def test_equal_models_are_not_rolled_back() -> None:
    learner, _ = guarded()
    feed(learner, items(3_000, seed=3, noise=0.2), 0)  # the live model is the shadow, labels 20 % noisy
    stats = learner.stats().guard
    assert stats is not None and stats.rollbacks == 0 and stats.promotions >= 50


def test_concept_drift_that_hurts_both_is_detected_and_not_rolled_back() -> None:
    learner, _ = guarded()
    feed(learner, items(500, seed=4, noise=0.05), 0)
    feed(learner, items(500, seed=5, noise=0.05, permute=True), 500)  # the labels swap: both models wrong
    stats = learner.stats().guard
    assert stats is not None and stats.rollbacks == 0 and stats.drifts >= 1
    drifts = [e for e in learner.take_events() if e.kind == "drift"]
    assert drifts and drifts[0].detector == "adwin:correct" and 500 <= drifts[0].item < 600


def test_the_reset_compensator_reaction_restores_the_start_state_between_batches() -> None:
    learner, inner = guarded(drift_reaction="reset-compensator")
    feed(learner, items(500, seed=4, noise=0.05), 0)
    assert inner.compensators == []
    feed(learner, items(100, seed=5, noise=0.05, permute=True), 500)
    drift = next(e for e in learner.take_events() if e.kind == "drift")
    assert drift.reaction == "reset-compensator"
    assert inner.compensators and inner.compensators[0] == [{"name": "fresh", "version": 0}]  # the start's


def test_unlabelled_items_feed_the_confidence_detector() -> None:
    learner, inner = guarded(drift_detector="page-hinkley")
    sure = [(torch.tensor([5.0, 0.0]) * (1 if i % 2 else -1), None) for i in range(400)]
    unsure = [(torch.tensor([0.01, 0.0]), None) for _ in range(400)]
    for i, (x, y) in enumerate(sure + unsure):
        learner.arrive(i, x, y)
    drifts = [e for e in learner.take_events() if e.kind == "drift"]
    assert drifts and drifts[0].detector == "page-hinkley:confidence" and drifts[0].item >= 400
    assert inner.loaded == 0  # no label, no comparison, no rollback


def test_a_decision_waits_for_the_outstanding_outcomes() -> None:
    learner, inner = guarded()
    feed(learner, items(100, seed=6), 0)
    inner.set_weight(-GOOD)
    data = items(100, seed=7)
    waiting = [learner.submit(100 + i, x, y) for i, (x, y) in enumerate(data)]  # one consumer batch
    for wait in waiting:
        wait()
    assert inner.loaded == 0  # decided within the batch, carried out only before the next one
    assert learner.pending_training() is False and inner.loaded == 1


def test_events_reach_the_events_topic_with_their_stream_position() -> None:
    settings = load_settings(None, env={"FERRET_KAFKA_TOPIC_PREFIX": "guard", "FERRET_TRAINER_DATASET": "covertype"})
    learner, inner = guarded()
    parts = assemble(settings, learner, SampleDecoder((2,), 2), None)
    producer = FakeProducer()
    parts.stream.connect(FakeConsumer(), producer)  # type: ignore[arg-type]
    parts.stream.partitions.assigned = frozenset({0})
    topics = settings.kafka.topics
    for offset, (x, y) in enumerate(items(300, seed=8)):
        if offset == 100:
            inner.set_weight(-GOOD)
        value = encode_sample(x.numpy(), stream="g", sequence=offset, label=y).SerializeToString()
        parts.stream.process(FakeMessage(topics.samples, 0, offset, value))  # type: ignore[arg-type]
        parts.stream.publish_events()
        producer.poll()
    events = []
    for topic, payload in producer.delivered:
        if topic == topics.events:
            event = messages_pb2.ModelEvent()
            event.ParseFromString(payload)
            events.append(event)
    rollbacks = [e for e in events if e.kind == "rollback"]
    assert len(rollbacks) == 1
    rollback = rollbacks[0]
    assert rollback.source_partition == 0 and rollback.source_offset == rollback.item  # one partition, i = offset
    assert rollback.model_version < rollback.previous_model_version
    assert parts.status.status().rollbacks == 1
    published = []
    for topic, payload in producer.delivered:
        if topic == topics.predictions:
            p = messages_pb2.Prediction()
            p.ParseFromString(payload)
            published.append(p)
    after = [p.model_version for p in published if p.item > rollback.item]
    assert after[0] == rollback.model_version  # downstream sees the version go back
    lineages = [p.model_lineage for p in published]
    assert len(set(lineages)) == 2 and lineages == sorted(lineages)  # one lineage before, one after
    assert {p.model_lineage for p in published if p.item > rollback.item} == {rollback.model_lineage}
    assert rollback.model_lineage > published[0].model_lineage  # (lineage, version) names the weights


def test_the_guard_counts_reach_get_status_the_cli_and_the_metrics() -> None:
    from prometheus_client import generate_latest

    from services.cli.control_cmd import format_status
    from services.control.messages import status_reply
    from services.control.trainer_port import TrainerState, TrainerStatus
    from services.trainer.metrics import TrainerMetrics

    status = TrainerStatus(rollbacks=2, promotions=7, drifts=1, last_good_version=1400)
    reply = status_reply(status, state=TrainerState.RUNNING, time_ms=0, uptime_s=1.0)
    assert (reply.rollbacks, reply.promotions, reply.drifts, reply.last_good_version) == (2, 7, 1, 1400)
    assert "last-good v1400, rollbacks 2, promotions 7, drifts 1" in format_status(reply)
    metrics = TrainerMetrics()
    metrics.register(lambda: status, lambda: None)
    text = generate_latest(metrics.registry).decode()
    for line in ("ferret_rollbacks_total 2.0", "ferret_promotions_total 7.0", "ferret_drifts_total 1.0",
                 "ferret_last_good_version 1400.0"):  # fmt: skip
        assert line in text
