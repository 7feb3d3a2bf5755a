"""The guard through the real local broker: a live model that turns bad mid-stream is rolled back, the
predictions on ``<prefix>.predictions`` show its model version going back to the last-good one, and a
``ModelEvent`` for the rollback (with the stream position) appears on ``<prefix>.events``.

The learner is a digits linear classifier behind :class:`GuardedLearner` (the wrapper ``make_learner``
puts around the trainer's learners); its weights are trained offline and, from item 150 on, negated: a
stand-in for weights wrecked by a poisoning burst, decided by the item counter so the test is exact.

Second, the recall test (services/trainer/guard/recall.py) on the same path: a burst of flipped labels on the
topic, fitted by a scripted live model that afterwards is right on what the stream brings but not on the
items from before the burst, is rolled back at the return of the shadow's concept by the recall test (its
detail on ``<prefix>.events``), and the predictions' version goes back."""

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

    def turn(self, item: int) -> None:
        """What happens to the weights as ``item`` arrives: negated at :data:`SABOTAGED_AT`."""
        if item == SABOTAGED_AT:
            with torch.no_grad():
                for p in self.net.parameters():
                    p.neg_()

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        self.turn(item)
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


# -- the recall test through the broker ----------------------------------------------------------------------
BURST = range(300, 500)  # items whose labels are flipped on the topic (y → y + 1 mod 10)
STREAM = 900
KNOWN = range(5)  # after the burst the stream brings digits of these classes only


def flipped(y: int) -> int:
    return (y + 1) % 10


def stream_items() -> list[tuple[int, int]]:
    """(digits index, label on the topic) per item: the dataset in order, labels flipped in the burst; after
    it, only digits of the :data:`KNOWN` classes, with their true labels."""
    y = [int(c) for c in load_dataset("digits", None).y_train]
    known = [i for i in range(BURST.stop, len(y)) if y[i] in KNOWN]
    out = [(i, flipped(y[i]) if i in BURST else y[i]) for i in range(BURST.stop)]
    return out + [(i, y[i]) for i in known[: STREAM - BURST.stop]]


def digits_linear(fit: Sequence[tuple[int, int]]) -> nn.Module:
    """A linear classifier of the digits trained offline (full batch) on these (index, label) pairs."""
    ds = load_dataset("digits", None)
    index = torch.tensor([i for i, _ in fit])
    x = torch.as_tensor(ds.x_train, dtype=torch.float32)[index].reshape(len(fit), 1, 8, 8)
    y = torch.tensor([label for _, label in fit])
    torch.manual_seed(0)
    unit = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(unit.parameters(), lr=0.5)
    for _ in range(300):
        optimizer.zero_grad()
        nn.functional.cross_entropy(unit(x), y).backward()
        optimizer.step()
    return unit


class BurstLearner(TurningLearner):
    """Fits the burst of flipped labels from its first item on, and from its end on holds weights that give
    the true class of the :data:`KNOWN` digits and still the flipped one of the others (a live model that
    re-learnt what the stream brings after the burst without unlearning the rest of it): the items since
    the return give the stream's SPRT no evidence, the items kept from before the fall (every class) do. A
    load (the rollback) replaces the weights for good."""

    def __init__(self, model: ZooModel) -> None:
        super().__init__(model)
        y = [int(c) for c in load_dataset("digits", None).y_train]
        self.burst_fit = digits_linear([(i, flipped(c)) for i, c in enumerate(y)])
        self.after_fit = digits_linear([(i, c if c in KNOWN else flipped(c)) for i, c in enumerate(y)])

    def turn(self, item: int) -> None:
        if item in (BURST.start, BURST.stop):
            self.net = copy.deepcopy(self.burst_fit if item == BURST.start else self.after_fit)

    def master_tensors(self) -> dict[str, torch.Tensor]:
        return self.state_tensors()


def produce_items(bootstrap: str, topic: str, chosen: Sequence[tuple[int, int]]) -> None:
    """One digits sample per (index, label), in order, as items 0, 1, …"""
    from confluent_kafka import Producer

    from services.kafka.record_codec import encode_sample

    ds = load_dataset("digits", None)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for seq, (i, label) in enumerate(chosen):
        x = (ds.x_train[i] * 255).astype("uint8")
        sample = encode_sample(x, stream="digits", sequence=seq, label=label)
        producer.produce(topic, sample.SerializeToString(), key=sample.id.encode())
    producer.flush(30)


def test_a_burst_of_flipped_labels_is_rolled_back_at_its_end_by_the_recall_test(stack: tuple[str, str, str]) -> None:
    bootstrap, redis_url, prefix = stack
    topics = TopicNames(prefix)
    settings = settings_for(bootstrap, redis_url, prefix, FERRET_KAFKA_SAMPLE_PARTITIONS="1")  # the guard's defaults
    model = digits_model()
    learner = GuardedLearner(BurstLearner(model), model, settings.guard)
    parts = assemble(settings, learner, SampleDecoder((1, 8, 8), 10), None)
    chosen = stream_items()
    assert len(chosen) == STREAM
    produce_items(bootstrap, topics.samples, chosen)
    running = Running(type("T", (), {"parts": parts})())  # type: ignore[arg-type]
    try:
        wait_for(lambda: parts.port.status().predictions_published >= STREAM)
    finally:
        running.close()
    status = parts.port.status()
    assert status.rollbacks == 1

    events = read_events(bootstrap, topics.events, status.promotions + status.drifts + 1)
    rollbacks = [e for e in events if e.kind == "rollback"]
    assert len(rollbacks) == 1
    rollback = rollbacks[0]
    assert "recall SPRT" in rollback.detail and "items kept from before the fall" in rollback.detail
    # the return is seen within ~2 of ADWIN's 32-item checks after the burst; carried out between batches
    assert BURST.stop < rollback.item < BURST.stop + 100
    assert rollback.model_version < BURST.start < rollback.previous_model_version  # weights from before it

    predictions = sorted(read_predictions(bootstrap, topics.predictions, STREAM), key=lambda p: p.item)
    assert [p.item for p in predictions] == list(range(STREAM))
    versions = [p.model_version for p in predictions]
    back = next(i for i in range(rollback.item + 1, STREAM) if versions[i] < versions[i - 1])
    assert back <= rollback.item + 256 and versions[back] == rollback.model_version
