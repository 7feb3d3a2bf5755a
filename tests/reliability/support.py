"""Helpers of the reliability tier's trainer tests: a real trainer in this process (``start_trainer``, the
code ``ferret run`` runs, its loop on a thread), or as ``ferret run`` processes (for kill -9), and the
outcomes counted by consuming the topics from the beginning with a fresh group (never the service's
counters, never watermarks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError

from services.config import Settings, load_settings
from services.kafka.admin import TopicNames
from services.kafka.record_codec import dead_letter_info
from services.localstack.ports import free_port
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.runner import TrainerProcess, start_trainer
from tests.integration.trainer_support import SNAPSHOT_KEY, wait_serving

ROOT = Path(__file__).resolve().parents[2]
FERRET = [sys.executable, "-m", "services.cli.main"]


def trainer_env(bootstrap: str, redis_url: str, prefix: str, partitions: int = 2, **extra: str) -> dict[str, str]:
    """``FERRET_*`` of a small trainer (digits, mlp, 2 workers) with a short session and no static
    membership: the embedded broker adds 6 s to each join of a static member (docs/reliability.md)."""
    return {
        "FERRET_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "FERRET_KAFKA_TOPIC_PREFIX": prefix,
        "FERRET_KAFKA_GROUP_ID": f"g-{prefix}",
        "FERRET_KAFKA_INSTANCE_ID": "replica-0",
        "FERRET_KAFKA_SESSION_TIMEOUT_MS": "2000",
        "FERRET_KAFKA_STATIC_MEMBERSHIP": "false",
        "FERRET_KAFKA_SAMPLE_PARTITIONS": str(partitions),
        "FERRET_REDIS_URL": redis_url,
        "FERRET_REDIS_NAMESPACE": prefix,
        "FERRET_REDIS_SNAPSHOT_INTERVAL_S": "0",
        "FERRET_REDIS_HMAC_KEY": SNAPSHOT_KEY,
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": "mlp",
        "FERRET_TRAINER_MAX_WORKERS": "2",
        "FERRET_CONTROL_LISTEN": f"127.0.0.1:{free_port()}",
        "FERRET_METRICS_PORT": "null",
        **extra,
    }


class InProcessTrainer:
    """``start_trainer`` (model, planner, learner, snapshots, control plane) with its loop on a thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process: TrainerProcess = start_trainer(settings)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @classmethod
    def from_env(cls, env: dict[str, str]) -> InProcessTrainer:
        return cls(load_settings(None, env=env))

    def _run(self) -> None:
        try:
            self.process.parts.stream.run(self.stop_event)
        except BaseException as exc:
            self.error = exc

    @property
    def status(self) -> Callable[[], object]:
        return self.process.parts.port.status

    def stop(self) -> BaseException | None:
        """Stop (the SIGTERM path) and return what the loop raised, if anything."""
        self.stop_event.set()
        self.thread.join(60)
        self.process.control.stop(grace_s=1)
        assert not self.thread.is_alive(), "the trainer loop did not stop"
        return self.error


class TrainerCommand:
    """``ferret run`` as a process of its own (what kill -9 needs)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.target = env["FERRET_CONTROL_LISTEN"]
        self.log = log
        self.handle = log.open("ab")
        self.proc = subprocess.Popen(
            [*FERRET, "run", "--log-level", "INFO"],
            env={**os.environ, **env},
            cwd=ROOT,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
        )

    def wait_serving(self, timeout: float = 90.0, service: str = "") -> None:
        wait_serving(self.proc, self.target, self.log, timeout, service)

    def wait_exit(self, timeout: float = 90.0) -> int:
        code = self.proc.wait(timeout)
        self.handle.close()
        return code

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait_exit(60)


@dataclass
class Outcomes:
    """Every outcome on the predictions topic and the DLQ, by the sample record it is for."""

    predictions: list[messages_pb2.Prediction] = field(default_factory=list)
    dead_letters: list[dict[str, str]] = field(default_factory=list)  # ferret.dlq.* headers (+ "duplicate")

    def by_record(self) -> Counter[tuple[int, int]]:
        records = Counter((p.source_partition, p.source_offset) for p in self.predictions)
        records.update((int(d["partition"]), int(d["offset"])) for d in self.dead_letters)
        return records

    def duplicates(self) -> tuple[int, int]:
        """(flagged, unflagged): re-emitted outcomes that say so, and extra copies that do not."""
        flagged = sum(p.duplicate for p in self.predictions)
        flagged += sum(d.get("duplicate") == "true" for d in self.dead_letters)
        extra = sum(n - 1 for n in self.by_record().values())
        return flagged, max(0, extra - flagged)


def read_outcomes(bootstrap: str, prefix: str, expected: int, timeout_s: float = 60.0, idle_s: float = 2.0) -> Outcomes:
    """Consume ``<prefix>.predictions`` and ``<prefix>.samples.dlq`` from the beginning with a fresh group
    until ``expected`` outcomes were read and nothing more came for ``idle_s``."""
    topics = TopicNames(prefix)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
            "fetch.wait.max.ms": 50,
        }
    )
    consumer.subscribe([topics.predictions, topics.dlq])
    out = Outcomes()
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is None or message.error() is not None:
                if message is not None and message.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"reading outcomes: {message.error()}")
                if out_count(out) >= expected and time.monotonic() - last > idle_s:
                    break
                continue
            last = time.monotonic()
            if message.topic() == topics.predictions:
                prediction = messages_pb2.Prediction()
                prediction.ParseFromString(message.value())
                out.predictions.append(prediction)
            else:
                headers = message.headers() or []
                info = dead_letter_info(headers)
                if ("ferret.dlq.duplicate", b"true") in headers:
                    info["duplicate"] = "true"
                out.dead_letters.append(info)
    finally:
        consumer.close()
    return out


def out_count(out: Outcomes) -> int:
    return len(out.predictions) + len(out.dead_letters)


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s")
        time.sleep(0.05)


@contextmanager
def trainer_in_process(env: dict[str, str]) -> Iterator[InProcessTrainer]:
    trainer = InProcessTrainer.from_env(env)
    try:
        yield trainer
    finally:
        trainer.stop()
