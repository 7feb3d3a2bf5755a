"""A diverged model never publishes a NaN confidence (docs/reliability.md, "Diverged weights").

Plain SGD at the default lr 1e-3 on the digits MLP, fed in-range inputs with half the pixels at ±1000 (the
default ``trainer.input_range`` admits them), grows its weights to ~1e33 within about a hundred items:
still finite, but a forward pass overflows float32, the logits hold ±inf and softmax gives NaN. The record
path then dead-letters the record (reason ``ModelDivergedError``, the message naming the largest weight
and the fix) instead of publishing a prediction whose confidence is NaN; the stream goes on."""

from __future__ import annotations

import math

import numpy as np

from services.config import load_settings
from services.kafka.record_codec import SampleDecoder, encode_sample
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.engine_learner import EngineLearner
from services.trainer.runner import assemble, build_zoo_model
from tests.unit.test_engine_support import make_plan
from tests.unit.test_trainer_stream import FakeConsumer, FakeMessage, FakeProducer

SETTINGS = load_settings(
    None,
    env={
        "FERRET_KAFKA_TOPIC_PREFIX": "div",
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": "mlp",
        "FERRET_GUARD_MAX_STEP_RATIO": "null",  # the norm guard off: the unguarded divergence this test reproduces
    },
)
TOPICS = SETTINGS.kafka.topics


def large_inputs(count: int, seed: int = 1) -> list[tuple[np.ndarray, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        x = rng.uniform(-1, 1, (1, 8, 8)).astype(np.float32)
        mask = rng.random((1, 8, 8)) < 0.5
        x[mask] = rng.choice([1000.0, -1000.0], int(mask.sum()))
        out.append((x, int(rng.integers(0, 10))))
    return out


def test_a_diverged_model_dead_letters_instead_of_publishing_a_nan_confidence() -> None:
    model = build_zoo_model(SETTINGS)
    learner = EngineLearner(model, make_plan(2, 2, num_units=model.num_units), SETTINGS)
    parts = assemble(SETTINGS, learner, SampleDecoder((1, 8, 8), 10), None)
    producer = FakeProducer()
    parts.stream.connect(FakeConsumer(), producer)  # type: ignore[arg-type]
    parts.stream.partitions.assigned = frozenset({0})
    outcomes: list[str] = []
    try:
        for offset, (x, y) in enumerate(large_inputs(150)):
            value = encode_sample(x, stream="div", sequence=offset, label=y).SerializeToString()
            before = len(producer.delivered)
            parts.stream.process(FakeMessage(TOPICS.samples, 0, offset, value))  # type: ignore[arg-type]
            producer.poll()
            new = producer.delivered[before:]
            assert len(new) == 1, new  # one outcome per record
            topic, payload = new[0]
            if topic == TOPICS.predictions:
                prediction = messages_pb2.Prediction()
                prediction.ParseFromString(payload)
                assert math.isfinite(prediction.confidence) and 0.0 <= prediction.confidence <= 1.0
                assert all(math.isfinite(c.probability) for c in prediction.top_k)
                outcomes.append("predicted")
            else:
                assert topic == TOPICS.dlq
                outcomes.append("dead_lettered")
            learner.drain(30)  # let training catch up, as a slower stream would (else most are skipped busy)
    finally:
        learner.drain(60)
        learner.close()
    assert outcomes[0] == "predicted"
    diverged = outcomes.count("dead_lettered")  # the red half: before, these were NaN-confidence predictions
    assert diverged > 0 and parts.stream.counters.dead_lettered == {"ModelDivergedError": diverged}
