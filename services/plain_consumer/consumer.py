"""The plain reference consumer: the loop a user would write instead of Ferret (issue 7 "Must show" (a)).

Poll the samples topic, predict every item with the model, publish the prediction, and take **one SGD step
per item with the same model, lr and optimizer as the trainer** (``build_zoo_model`` with the trainer's
settings, ``torch.optim.SGD(lr=trainer.lr)``, no momentum: DESIGN §3.11's plain SGD; the trainer's torch
threads, flushed denormals and kept freed memory, ``trainer.retain_freed_memory``), **skipping while
busy**: one thread, items in order; every item is predicted and published, and trained on only if the
loop reached it within ``MAX_AGE_MS`` of its event time (older: it waited behind the loop's earlier work,
a backlog, so training it would only let the backlog grow). At a rate the loop keeps up with, every item
is trained; above it the loop trains what it can and stays within ``MAX_AGE_MS`` of the stream.

Run as a separate process (as ``ferret run`` is, so neither shares a GIL with the producer):

    python -m services.plain_consumer --bootstrap HOST:PORT --prefix P --items N [--model mnistnet] [--timeline]

(``python -m benchmarks.live.plain_loop`` is the same command.) ``ferret demo`` runs it on the same items at
the same rate after Ferret's run (:mod:`services.demo.plain_phase`); ``benchmarks/live/`` beside it.

It prints one JSON line: items, trained, correct, latencies (prediction handed to the Kafka client − the
sample's event time, as a Prediction's ``latency_ms``), CPU seconds, and per labelled item (by the
producer's sequence number) whether it was predicted correctly, whether it was trained, and how many SGD
steps the model had taken when it predicted it (a Prediction's ``model_version``); with ``--timeline``, also
``timeline``: ``[published ms, correct]`` per labelled item in the order it was predicted (the running
accuracy curve). ``--saturation K`` instead measures,
without Kafka, how many items/s the loop's predict + SGD step sustains over K items (its saturation rate).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import uuid

import numpy as np
import torch
import torch.nn.functional as F
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from ferret_core.data import normalise
from ferret_core.engine.heap import retain_freed_memory
from services.config import Settings, load_settings
from services.kafka.record_codec import SampleDecoder, ValidSample, now_ms
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.runner import build_zoo_model
from services.trainer.stream import CONSUMER_DEFAULTS


def trainer_settings(dataset: str, model: str, bootstrap: str = "localhost:9092", prefix: str = "ferret") -> Settings:
    return load_settings(
        None,
        env={
            "FERRET_TRAINER_DATASET": dataset,
            "FERRET_TRAINER_MODEL": model,
            "FERRET_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "FERRET_KAFKA_TOPIC_PREFIX": prefix,
        },
    )


# Skip while busy: an item the loop reaches later than this after its event time arrived while the loop was
# busy with earlier ones (a backlog), so it is predicted but not trained. Generous to the plain loop: it is
# ten times the Kafka hop's measured p99 (~20 ms, benchmarks/service), so jitter alone skips nothing.
MAX_AGE_MS = 200.0


class PlainLoop:
    """The model and its optimizer, as a user would hold them."""

    def __init__(self, settings: Settings) -> None:
        torch.set_num_threads(settings.trainer.threads)  # the trainer's own torch and heap settings
        torch.set_flush_denormal(True)
        if settings.trainer.retain_freed_memory:
            retain_freed_memory()
        self.model = build_zoo_model(settings).as_sequential()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=settings.trainer.lr)

    def predict(self, x: torch.Tensor) -> int:
        with torch.no_grad():
            return int(self.model(x.unsqueeze(0)).argmax(1).item())

    def train(self, x: torch.Tensor, y: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(x.unsqueeze(0)), torch.tensor([y])).backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()


def saturation(settings: Settings, items: int) -> dict[str, object]:
    """Items/s of predict + one SGD step, without Kafka (the first 20 items warm up and are not counted)."""
    from ferret_core.data import load_dataset
    from services.config.data_root import default_data_root

    data = load_dataset(settings.trainer.dataset, default_data_root())
    loop = PlainLoop(settings)
    xs = [normalise(np.ascontiguousarray(data.x_train[i])) for i in range(items + 20)]
    ys = [int(data.y_train[i]) for i in range(items + 20)]
    for i in range(20):
        loop.predict(xs[i])
        loop.train(xs[i], ys[i])
    began = time.perf_counter()
    for i in range(20, items + 20):
        loop.predict(xs[i])
        loop.train(xs[i], ys[i])
    seconds = time.perf_counter() - began
    return {"items": items, "seconds": seconds, "items_per_s": items / seconds, "ms_per_item": 1000 * seconds / items}


class HopTrace:
    """``--trace`` (the stall diagnosis, README "Stalls"): per item (sequence, event ms, the record's Kafka
    timestamp type and ms — the broker's append time on a ``LogAppendTime`` topic —, receipt ms when
    ``poll`` returned it, published ms), and every garbage collection of the loop's process (wall ms at its
    start, its duration in ms, generation), timed with ``gc.callbacks``."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int, int, int, int, int]] = []
        self.gc: list[tuple[int, float, int]] = []
        self._gc_start = (0, 0.0)
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = (now_ms(), time.perf_counter())
        else:
            self.gc.append((self._gc_start[0], round(1000 * (time.perf_counter() - self._gc_start[1]), 3),
                            info["generation"]))  # fmt: skip


def consume(
    settings: Settings,
    items: int,
    timeout_s: float,
    max_age_ms: float,
    trace: HopTrace | None = None,
    *,
    timeline: bool = False,
) -> dict[str, object]:
    kafka = settings.kafka
    topics = kafka.topics
    spec_shape = build_zoo_model(settings).input_shape
    decoder = SampleDecoder(spec_shape, build_zoo_model(settings).num_classes)
    loop = PlainLoop(settings)
    consumer = Consumer(
        {
            **kafka.client_config(),
            **CONSUMER_DEFAULTS,
            "group.id": f"plain-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer({**kafka.client_config(), "linger.ms": 5})
    # every partition assigned from the beginning (no group join: a subscribe took ~20 s per run on the
    # local broker, before READY and outside the measured stream, but of every run's wall time)
    partitions = consumer.list_topics(topics.samples, timeout=10).topics[topics.samples].partitions
    consumer.assign([TopicPartition(topics.samples, p, OFFSET_BEGINNING) for p in partitions])
    print("READY", flush=True)
    latencies: list[float] = []
    seen = trained = correct = labelled = 0
    per_item: dict[int, tuple[int, int, int]] = {}  # sequence -> (correct, trained, updates before predicting)
    moments: list[tuple[int, int]] = []  # (published ms, correct) per labelled item, in prediction order
    cpu0 = time.process_time()
    deadline = time.monotonic() + timeout_s
    first_at = last_at = None
    try:
        while seen < items and time.monotonic() < deadline:
            message = consumer.poll(0.1)  # one record at a time, as soon as it is there
            if message is None or message.error():
                continue
            received = now_ms()
            sample = decoder.decode(message.value() or b"")
            if not isinstance(sample, ValidSample):  # a malformed record: the trainer dead-letters it, skipped here
                continue
            prediction = loop.predict(sample.x)
            published = now_ms()
            out = messages_pb2.Prediction(
                sample_id=sample.sample_id, sequence=sample.sequence, predicted_class=prediction,
                latency_ms=published - sample.event_time_ms, stream=sample.stream,
            )  # fmt: skip
            producer.produce(topics.predictions, value=out.SerializeToString(), key=sample.sample_id.encode())
            producer.poll(0)
            seen += 1
            if trace is not None:
                kind, stamp = message.timestamp()
                trace.items.append((sample.sequence, sample.event_time_ms, kind, stamp, received, published))
            if sample.label is None:  # the unlabelled warm-up stream: predicted, not counted
                continue
            latencies.append(float(published - sample.event_time_ms))
            labelled += 1
            first_at = first_at if first_at is not None else time.monotonic()
            last_at = time.monotonic()
            correct += int(prediction == sample.label)
            if timeline:
                moments.append((published, int(prediction == sample.label)))
            updates_before = trained
            young = published - sample.event_time_ms <= max_age_ms
            if young:  # not behind: one SGD step on it
                loop.train(sample.x, sample.label)
                trained += 1
            per_item[sample.sequence] = (int(prediction == sample.label), int(young), updates_before)
    finally:
        producer.flush(10)
        consumer.close()
    return {
        **({"trace": {"items": trace.items, "gc": trace.gc}} if trace is not None else {}),
        **({"timeline": moments} if timeline else {}),
        "items": seen,
        "labelled": labelled,
        "trained": trained,
        "correct": correct,
        "latencies_ms": latencies,
        "per_item": {str(k): v for k, v in sorted(per_item.items())},
        "cpu_s": time.process_time() - cpu0,
        "span_s": (last_at - first_at) if first_at is not None and last_at is not None else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--model", default="mnistnet")
    parser.add_argument("--bootstrap", default="localhost:9092")
    parser.add_argument("--prefix", default="ferret")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--max-age-ms", type=float, default=MAX_AGE_MS, help="train only items younger than this")
    parser.add_argument("--trace", action="store_true", help="per-item hop times and GC pauses (HopTrace)")
    parser.add_argument("--saturation", type=int, default=0, help="measure the saturation rate over K items")
    parser.add_argument("--timeline", action="store_true", help="[published ms, correct] per labelled item")
    args = parser.parse_args(argv)
    settings = trainer_settings(args.dataset, args.model, args.bootstrap, args.prefix)
    result: dict[str, object]
    if args.saturation:
        result = saturation(settings, args.saturation)
    else:
        trace = HopTrace() if args.trace else None
        result = consume(settings, args.items, args.timeout_s, args.max_age_ms, trace, timeline=args.timeline)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
