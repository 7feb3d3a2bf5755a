"""Fuzzing the record path through the learner: hostile Sample bytes and values reach the
trainer's real :class:`EngineLearner` (digits MLP, 2 stages, 2 workers, asynchronous training) through
:class:`RecordStream` (decode → arrive → publish), with fake Kafka clients and no broker in the loop.

2,200 generated records (200 arbitrary byte strings, 2,000 Samples of the model's shape whose values mix
tame pixels with any number of the largest finite values the input range admits, ±1000, and in a third of
them hostile ones: NaN, ±inf, 1e6, ±3e38, float16 65504, subnormals; labels valid, absent or out of
range), decoded by a decoder that
rejects out-of-range values and by ones that clip or rescale them into range (so large inputs do train).
For each record: no exception, exactly one outcome (a prediction for that offset or a dead letter), and
the master weights stay finite (checked every 100 records and after the last training step), and no
published prediction carries a non-finite confidence (a diverged model's records are dead-lettered,
``ModelDivergedError``: docs/reliability.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from services.config import load_settings
from services.kafka.record_codec import SampleDecoder
from services.proto_gen.ferret.v1 import messages_pb2
from services.proto_gen.ferret.v1.messages_pb2 import Sample, Tensor
from services.trainer.engine_learner import EngineLearner
from services.trainer.runner import TrainerParts, assemble, build_zoo_model
from tests.unit.test_engine_support import make_plan
from tests.unit.test_trainer_stream import FakeConsumer, FakeMessage, FakeProducer

SETTINGS = load_settings(
    None, env={"FERRET_KAFKA_TOPIC_PREFIX": "fuzz", "FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp"}
)
TOPICS = SETTINGS.kafka.topics
SHAPE = (1, 8, 8)
CLASSES = 10
LARGE = [1000.0, -1000.0, 999.9999, -999.9999]  # the largest finite values the default input range admits
HOSTILE = [math.nan, math.inf, -math.inf, 1e6, 3e38, -3e38, 65504.0, 1e-45, -0.0]


@dataclass
class Trainer:
    """Per normaliser a learner behind its record path, with its fake clients; the next offset."""

    learners: list[EngineLearner] = field(default_factory=list)
    paths: dict[str, tuple[TrainerParts, FakeProducer]] = field(default_factory=dict)
    offset: int = 0
    records: int = 0


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    out = Trainer()
    for normaliser in ("none", "clip", "minmax"):
        model = build_zoo_model(SETTINGS)
        learner = EngineLearner(model, make_plan(2, 2, num_units=model.num_units), SETTINGS)
        out.learners.append(learner)
        parts = assemble(SETTINGS, learner, SampleDecoder(SHAPE, CLASSES, normaliser=normaliser), None)
        producer = FakeProducer()
        parts.stream.connect(FakeConsumer(), producer)  # type: ignore[arg-type]
        parts.stream.partitions.assigned = frozenset({0})
        out.paths[normaliser] = (parts, producer)
    yield out  # type: ignore[misc]
    for learner in out.learners:
        learner.drain(60)
        assert_finite(learner)
        learner.close()


def assert_finite(learner: EngineLearner) -> None:
    for name, tensor in learner.state_tensors().items():
        assert bool(torch.isfinite(tensor.float()).all()), f"{name} is not finite"


def one_outcome(trainer: Trainer, normaliser: str, value: bytes | None) -> str:
    """Send ``value`` down the record path; check exactly one outcome names its offset; return its kind."""
    parts, producer = trainer.paths[normaliser]
    offset = trainer.offset = trainer.offset + 1
    before = len(producer.delivered)
    parts.stream.process(FakeMessage(TOPICS.samples, 0, offset, value))  # type: ignore[arg-type]
    producer.poll()
    new = producer.delivered[before:]
    assert len(new) == 1, new
    topic, payload = new[0]
    trainer.records += 1
    if trainer.records % 100 == 0:
        for learner in trainer.learners:
            assert_finite(learner)
    if topic == TOPICS.predictions:
        prediction = messages_pb2.Prediction()
        prediction.ParseFromString(payload)
        assert (prediction.source_partition, prediction.source_offset) == (0, offset)
        # a diverged model (huge finite weights whose forward overflows) dead-letters instead (docs/reliability.md)
        assert math.isfinite(prediction.confidence) and 0.0 <= prediction.confidence <= 1.0
        assert all(math.isfinite(c.probability) for c in prediction.top_k)
        return "predicted"
    assert topic == TOPICS.dlq
    return "dead_lettered"


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@fuzz(200)
@given(value=st.one_of(st.none(), st.binary(max_size=512)), normaliser=st.sampled_from(["none", "clip", "minmax"]))
def test_arbitrary_bytes_get_one_outcome_through_the_learner(
    trainer: Trainer, value: bytes | None, normaliser: str
) -> None:
    event(one_outcome(trainer, normaliser, value))


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    """A Sample of the model's shape: pixels from a seeded generator (fast), then some of them replaced by
    the largest in-range values and, in a third of the samples, by hostile ones (drawn by hypothesis)."""
    count = math.prod(SHAPE)
    dtype = draw(st.sampled_from(["float32", "float32", "float64", "float16", "uint8"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype == "uint8":
        data = rng.integers(0, 256, count, dtype=np.uint8).tobytes()
    else:
        x = rng.uniform(-1, 1, count)
        large = draw(st.lists(st.integers(0, count - 1), max_size=count))
        x[large] = rng.choice(LARGE, len(large))
        if draw(st.integers(0, 2)) == 0:
            for index in draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=4)):
                x[index] = draw(st.sampled_from(HOSTILE))
        with np.errstate(over="ignore", invalid="ignore"):
            data = x.astype(dtype).tobytes()
    sample = Sample(id=f"fuzz/{draw(st.integers(0, 10**6))}", sequence=1, stream="fuzz")
    sample.tensor.CopyFrom(Tensor(shape=list(SHAPE), dtype=dtype, data=data))
    label = draw(st.integers(0, CLASSES - 1) | st.integers(0, CLASSES - 1) | st.none() | st.integers(-3, CLASSES + 3))
    if label is not None:
        sample.label = label
    return sample


@fuzz(2000)
@given(sample=samples(), normaliser=st.sampled_from(["none", "clip", "clip", "minmax", "minmax"]))
def test_hostile_values_get_one_outcome_and_never_a_nan_weight(
    trainer: Trainer, sample: Sample, normaliser: str
) -> None:
    event(f"{normaliser}: {one_outcome(trainer, normaliser, sample.SerializeToString())}")
