"""Helpers for trainer integration tests: a small real learner, settings, producing and reading back."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch
from confluent_kafka import Consumer, Producer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ferret_core.engine import SkipReason
from ferret_core.plan import Partition, Plan, WorkerConfig
from services.config import Settings, load_settings
from services.kafka.record_codec import encode_sample
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.learner import ArrivalOutcome, LearnerStats, settled


class LinearLearner:
    """A one-worker, one-stage SGD learner on a linear model: enough to exercise the service path (the
    pipeline engine has its own tests). Training runs on a thread of its own, after ``arrive`` returns."""

    def __init__(self, features: int, classes: int, lr: float = 0.1) -> None:
        torch.manual_seed(0)
        self.weight = torch.zeros(classes, features)
        self.bias = torch.zeros(classes)
        self.lr = lr
        self.updates = 0
        self.applied: list[Plan] = []
        self.plan = one_stage_plan()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        return settled(self.arrive(item, x, y, event_time_ms))

    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        with self._lock:
            logits = self.weight @ x.reshape(-1) + self.bias
            version = self.updates
        probs = torch.softmax(logits, dim=0)
        predicted, confidence = int(probs.argmax()), float(probs.max())
        if y is None:
            return ArrivalOutcome(predicted, confidence, version, SkipReason.NO_LABEL, None)

        def train() -> None:
            with self._lock:
                v = x.reshape(-1)
                probs = torch.softmax(self.weight @ v + self.bias, dim=0)
                probs[y] -= 1.0
                self.weight = self.weight - self.lr * torch.outer(probs, v)
                self.bias = self.bias - self.lr * probs
                self.updates += 1

        thread = threading.Thread(target=train)
        thread.start()
        self._threads.append(thread)
        return ArrivalOutcome(predicted, confidence, version, None, 0)

    def pending_training(self) -> bool:
        return False  # trains on threads of its own

    def train_step(self) -> bool:
        return False

    def drain(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()

    def apply_plan(self, plan: Plan) -> None:
        self.applied.append(plan)
        self.plan = plan

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight.clone(), "bias": self.bias.clone(), "updates": torch.tensor(self.updates)}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.weight = tensors["weight"].clone()
        self.bias = tensors["bias"].clone()
        self.updates = int(tensors["updates"])

    def compensator_state(self) -> list[dict[str, Any]]:
        return []  # no compensator

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        assert not states

    def stats(self) -> LearnerStats:
        return LearnerStats(backward_passes=self.updates, model_version=self.updates, measured_bytes=0, peak_bytes=0)

    def close(self) -> None:
        self.drain()


def one_stage_plan() -> Plan:
    return Plan(
        model="linear",
        partition=Partition((0, 1)),
        workers=(WorkerConfig(0, True, False, (1,), (0,)),),
        arrival_interval=1.0,
        decay=0.0,
        stage_forward_time=0.5,
        stage_backward_time=0.5,
        adaptation_rate=1.0,
        planned_bytes=1,
        paper_memory_elements=1,
        min_feasible_bytes=1,
        budget_bytes=None,
        memory_model="paper",
        dtype="float32",
    )


# The tests' trainers sign their snapshots as a deployment's do (services/snapshots/signing.py).
SNAPSHOT_KEY = "ferret-tests-snapshot-signing-key"


def settings_for(bootstrap: str, redis_url: str, prefix: str, **extra: str) -> Settings:
    env = {
        "FERRET_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "FERRET_KAFKA_TOPIC_PREFIX": prefix,
        "FERRET_KAFKA_GROUP_ID": f"trainer-{prefix}",
        "FERRET_KAFKA_INSTANCE_ID": "replica-0",
        "FERRET_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "FERRET_KAFKA_SAMPLE_PARTITIONS": "2",
        "FERRET_REDIS_URL": redis_url,
        "FERRET_REDIS_NAMESPACE": f"test-{uuid.uuid4().hex[:8]}",
        "FERRET_REDIS_SNAPSHOT_INTERVAL_S": "0",
        "FERRET_REDIS_HMAC_KEY": SNAPSHOT_KEY,
        "FERRET_TRAINER_DATASET": "digits",
        **extra,
    }
    return load_settings(None, env=env)


def produce_digits(
    bootstrap: str, topic: str, count: int, *, start: int = 0, labels: bool = True, spacing_ms: int | None = None
) -> list[str]:
    """Produce ``count`` digits items; ``spacing_ms`` stamps event times that far apart (a paced stream)."""
    from ferret_core.data import load_dataset

    ds = load_dataset("digits", None)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    ids = []
    for seq in range(start, start + count):
        x = (ds.x_train[seq % len(ds.x_train)] * 255).astype(np.uint8)
        label = int(ds.y_train[seq % len(ds.y_train)]) if labels else None
        event_time = None if spacing_ms is None else 1_700_000_000_000 + seq * spacing_ms
        sample = encode_sample(x, stream="digits", sequence=seq, label=label, event_time_ms=event_time)
        producer.produce(topic, sample.SerializeToString(), key=sample.id.encode())
        ids.append(sample.id)
    producer.flush(30)
    return ids


def read_predictions(
    bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0
) -> list[messages_pb2.Prediction]:
    """Every prediction on the topic, read from the beginning by a fresh group (never watermarks)."""
    import time

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([topic])
    out: list[messages_pb2.Prediction] = []
    deadline = time.monotonic() + timeout_s
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                if len(out) >= expected and time.monotonic() - idle_since > 1.5:
                    break
                continue
            idle_since = time.monotonic()
            prediction = messages_pb2.Prediction()
            prediction.ParseFromString(message.value())
            out.append(prediction)
    finally:
        consumer.close()
    return out


def wait_serving(
    proc: subprocess.Popen[bytes], target: str, log: Path, timeout: float = 90.0, service: str = ""
) -> None:
    """Poll the trainer's standard health service at ``target`` until ``service`` is SERVING; fail with the
    end of its ``log`` if the process dies or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"trainer died: {log.read_text()[-3000:]}"
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise AssertionError(f"trainer not serving in {timeout} s: {log.read_text()[-3000:]}")
