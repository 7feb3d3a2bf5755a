"""The guard through the real local broker: a live model that turns bad mid-stream is rolled back, the
predictions on ``<prefix>.predictions`` show its model version going back to the last-good one, and a
``ModelEvent`` for the rollback (with the stream position) appears on ``<prefix>.events``.

The learner is a digits linear classifier behind :class:`GuardedLearner` (the wrapper ``make_learner``
puts around the trainer's learners); its weights are trained offline and, from item 150 on, negated: a
stand-in for weights wrecked by a poisoning burst, decided by the item counter so the test is exact."""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest
import torch
from confluent_kafka import Consumer
from torch import nn

from ferret_core.data import load_dataset
from ferret_core.plan import Plan
from ferret_core.zoo import ZooModel
from services.kafka.admin import TopicNames, ensure_topics
from services.kafka.record_codec import SampleDecoder
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.guard.learner import GuardedLearner
from services.trainer.learner import ArrivalOutcome, LearnerStats, settled
from services.trainer.runner import assemble

from .test_trainer_service import Running, wait_for
from .trainer_support import one_stage_plan, produce_digits, read_predictions, settings_for

pytestmark = pytest.mark.integration

SABOTAGED_AT = 150


def digits_model() -> ZooModel:
    """A linear classifier of the digits, trained offline (full batch): right on most items."""
    ds = load_dataset("digits", None)
    x = torch.as_tensor(ds.x_train, dtype=torch.float32).reshape(len(ds.x_train), -1)
    y = torch.as_tensor(ds.y_train)
    torch.manual_seed(0)
    unit = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(unit.parameters(), lr=0.5)
    for _ in range(200):
        optimizer.zero_grad()
        nn.functional.cross_entropy(unit(x.reshape(-1, 1, 8, 8)), y).backward()
        optimizer.step()
    return ZooModel("digits-linear", (unit,), (1, 8, 8), 10)


class TurningLearner:
    """The Learner contract over a copy of the model whose weights are negated from item
    :data:`SABOTAGED_AT` on (until a rollback loads others); one model version per item."""

    def __init__(self, model: ZooModel) -> None:
        self.net = copy.deepcopy(model.units[0])
        self.version = 0
        self.plan: Plan = one_stage_plan()

    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        return self.submit(item, x, y, event_time_ms)()

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        if item == SABOTAGED_AT:
            with torch.no_grad():
                for p in self.net.parameters():
                    p.neg_()
        with torch.no_grad():
            probs = torch.softmax(self.net(x.unsqueeze(0))[0], 0)
        c = int(probs.argmax())
        outcome = ArrivalOutcome(c, float(probs[c]), self.version, None, 0)
        self.version += 1
        return settled(outcome)

    def pending_training(self) -> bool:
        return False

    def train_step(self) -> bool:
        return False

    def measured_service_times(self) -> list[float | None]:
        return [None]

    def drain(self, timeout: float | None = None) -> None: ...

    def apply_plan(self, plan: Plan) -> None:
        self.plan = plan

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"model.0.{k}": v.detach().clone() for k, v in self.net.state_dict().items()}
        out["engine.updates"] = torch.tensor(self.version)
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict({k.removeprefix("model.0."): v for k, v in tensors.items() if k.startswith("model.")})
        self.version = int(tensors["engine.updates"])

    def compensator_state(self) -> list[dict[str, Any]]:
        return []

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None: ...

    def stats(self) -> LearnerStats:
        return LearnerStats(backward_passes=self.version, model_version=self.version, measured_bytes=0, peak_bytes=0)

    def close(self) -> None: ...


def read_events(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0) -> list[messages_pb2.ModelEvent]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"events-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    out: list[messages_pb2.ModelEvent] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(out) < expected:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            event = messages_pb2.ModelEvent()
            event.ParseFromString(message.value())
            out.append(event)
    finally:
        consumer.close()
    return out


@pytest.fixture
def stack(bootstrap_servers: str, redis_url: str, topic_prefix: str) -> Iterator[tuple[str, str, str]]:
    created = ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=1)
    assert created[TopicNames(topic_prefix).events] == 1  # the events topic is created with the others
    yield bootstrap_servers, redis_url, topic_prefix


def test_a_rollback_shows_in_the_predictions_and_on_the_events_topic(stack: tuple[str, str, str]) -> None:
    bootstrap, redis_url, prefix = stack
    topics = TopicNames(prefix)
    settings = settings_for(
        bootstrap, redis_url, prefix, FERRET_KAFKA_SAMPLE_PARTITIONS="1", FERRET_GUARD_WINDOW="50",
        FERRET_GUARD_PROBATION_ITEMS="0",
    )  # fmt: skip  (probation 0: promoted at the verdict, before the sabotage; probation: test_guard_probation.py)
    model = digits_model()
    learner = GuardedLearner(TurningLearner(model), model, settings.guard)
    parts = assemble(settings, learner, SampleDecoder((1, 8, 8), 10), None)
    produce_digits(bootstrap, topics.samples, 400)
    running = Running(type("T", (), {"parts": parts})())  # type: ignore[arg-type]
    try:
        wait_for(lambda: parts.port.status().predictions_published >= 400)
    finally:
        running.close()
    status = parts.port.status()
    assert status.rollbacks == 1 and status.promotions >= 1

    events = [e for e in read_events(bootstrap, topics.events, status.promotions + 2) if e.kind == "rollback"]
    assert len(events) == 1
    rollback = events[0]
    assert SABOTAGED_AT < rollback.item < SABOTAGED_AT + 60
    assert rollback.instance_id == "replica-0" and rollback.source_partition == 0
    assert rollback.source_offset == rollback.item  # one partition: offset i holds item i
    assert rollback.model_version < SABOTAGED_AT < rollback.previous_model_version

    predictions = sorted(read_predictions(bootstrap, topics.predictions, 400), key=lambda p: p.item)
    assert [p.item for p in predictions] == list(range(400))
    versions = [p.model_version for p in predictions]
    # carried out between consumer batches (at most 256 records after the deciding item): from then on the
    # predictions carry the last-good version and count on from it
    back = next(i for i in range(rollback.item + 1, 400) if versions[i] < versions[i - 1])
    assert back <= rollback.item + 256
    assert versions[back - 1] + 1 == rollback.previous_model_version and versions[back] == rollback.model_version
    assert versions[back:] == list(range(rollback.model_version, rollback.model_version + 400 - back))
