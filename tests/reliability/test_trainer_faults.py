"""The trainer under faults and hostile input, against the real broker and Redis.

Every outcome is counted by consuming ``<prefix>.predictions`` and ``<prefix>.samples.dlq`` from the
beginning with a fresh group (:func:`tests.reliability.support.read_outcomes`), never from the service's
counters. docs/reliability.md lists each fault, the promise and what these tests measured.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis
import torch
from confluent_kafka import Producer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.control.health import SNAPSHOTS
from services.kafka.admin import TopicNames, ensure_topics
from services.kafka.record_codec import encode_sample
from services.localstack.broker import TansuBroker
from services.localstack.ports import free_port
from services.localstack.redis_server import RedisServer
from services.proto_gen.ferret.v1 import messages_pb2
from services.snapshots import SnapshotStore
from services.trainer import publisher as publisher_module
from tests.integration.trainer_support import produce_digits
from tests.reliability.conftest import PasswordValkey
from tests.reliability.support import (
    FERRET,
    TrainerCommand,
    read_outcomes,
    trainer_env,
    trainer_in_process,
    wait_for,
)

pytestmark = pytest.mark.integration

DIGITS_SHAPE = (1, 8, 8)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> list[tuple[int, int]]:
    """Produce raw values; return where each landed (partition, offset)."""
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 8_000_000})
    landed: dict[int, tuple[int, int]] = {}

    def delivered(err: object, msg: object) -> None:
        assert err is None, err
        index = int(msg.key().decode().rpartition("-")[2])  # type: ignore[attr-defined]
        landed[index] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

    for i, value in enumerate(values):
        producer.produce(topic, value, key=f"hostile-{i}".encode(), on_delivery=delivered)
    assert producer.flush(30) == 0
    return [landed[i] for i in range(len(values))]


def health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


def _hostile_values() -> dict[str, bytes]:
    """Poisonous records: a 2 MiB record, large finite inputs, bytes that are no Sample."""

    def floats(value: float, dtype: type[np.floating[object]] = np.float32, seq: int = 0) -> bytes:
        x = np.full(DIGITS_SHAPE, value, dtype=dtype)
        return encode_sample(x, stream="hostile", sequence=seq, label=1).SerializeToString()

    return {
        "large_record": b"\x00" * (2 * 1024 * 1024),
        "float32_1e6": floats(1e6, seq=1),
        "float32_3e38": floats(3e38, seq=2),
        "float32_-3e38": floats(-3e38, seq=3),
        "float16_65504": floats(65504.0, np.float16, seq=4),
        "garbage": b"\xff\xfe not a protobuf \x00" * 8,
    }


def _predicted_records(landed: list[tuple[int, int]], outcomes_by_record: dict[tuple[int, int], int]) -> list[int]:
    return [outcomes_by_record.get(where, 0) for where in landed]


def test_hostile_records_get_one_outcome_each_and_lag_is_zero_when_idle(
    bootstrap_servers: str, redis_url: str, topic_prefix: str
) -> None:
    """Large record, large finite inputs and garbage between good records: one outcome per record (the
    hostile ones dead-lettered with their reason), finite weights, and once caught up a lag of 0 items and
    0 s per partition that stays 0 while the stream is idle."""
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    topics = TopicNames(topic_prefix)
    produce_digits(bootstrap_servers, topics.samples, 40)
    hostile = _hostile_values()
    landed = _produce(bootstrap_servers, topics.samples, list(hostile.values()))
    produce_digits(bootstrap_servers, topics.samples, 40, start=40)
    with trainer_in_process(trainer_env(bootstrap_servers, redis_url, topic_prefix)) as trainer:
        outcomes = read_outcomes(bootstrap_servers, topic_prefix, expected=86)
        by_record = outcomes.by_record()
        assert sum(by_record.values()) == 86 and set(by_record.values()) == {1}, by_record
        assert _predicted_records(landed, by_record) == [1] * len(hostile)
        reasons = {(int(d["partition"]), int(d["offset"])): d["reason"] for d in outcomes.dead_letters}
        assert [reasons.get(where) for where in landed] == [
            "too_large",
            "out_of_range",
            "out_of_range",
            "out_of_range",
            "out_of_range",
            "undecodable",
        ], reasons
        assert outcomes.duplicates() == (0, 0)
        for name, tensor in trainer.process.parts.learner.state_tensors().items():
            assert torch.isfinite(tensor.float()).all(), name

        def caught_up() -> bool:
            status = trainer.status()
            return dict(status.lag_items_by_partition) == {0: 0, 1: 0} and status.lag_items == 0  # type: ignore[attr-defined]

        wait_for(caught_up, 30, "lag 0 on both partitions")
        for _ in range(3):  # idle: the lag stays 0 and its age does not grow
            time.sleep(0.5)
            status = trainer.status()
            assert dict(status.lag_items_by_partition) == {0: 0, 1: 0}  # type: ignore[attr-defined]
            assert (status.lag_items, status.lag_seconds) == (0, 0.0)  # type: ignore[attr-defined]
        produce_digits(bootstrap_servers, topics.samples, 10, start=80)  # the stream resumes: outcomes again
        assert len(read_outcomes(bootstrap_servers, topic_prefix, expected=96).by_record()) == 96
        assert trainer.error is None


def test_start_up_falls_back_past_a_corrupt_snapshot_and_runs_degraded_without_redis(
    bootstrap_servers: str, redis_url: str, redis_client: redis.Redis, topic_prefix: str, own_valkey: RedisServer
) -> None:
    """Start-up restores the newest *valid* snapshot (v3, the shutdown's, lost a chunk: v2), and with Redis down starts
    anyway (snapshots degraded) and keeps predicting."""
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    topics = TopicNames(topic_prefix)
    env = trainer_env(bootstrap_servers, redis_url, topic_prefix)
    produce_digits(bootstrap_servers, topics.samples, 20)
    with trainer_in_process(env) as first:
        read_outcomes(bootstrap_servers, topic_prefix, expected=20)
        port = first.process.parts.port
        assert port.save_snapshot({}).version == 1
        produce_digits(bootstrap_servers, topics.samples, 10, start=20)
        read_outcomes(bootstrap_servers, topic_prefix, expected=30)
        assert port.save_snapshot({}).version == 2
    store = SnapshotStore(redis_client, env["FERRET_REDIS_NAMESPACE"], env["FERRET_KAFKA_INSTANCE_ID"])
    newest = max(store.list_versions())  # 3: the shutdown's
    assert newest == 3
    redis_client.delete(f"{env['FERRET_REDIS_NAMESPACE']}:snap:{{replica-0}}:v{newest}:chunk:0")
    with trainer_in_process(env) as second:
        assert second.status().last_snapshot_version == newest - 1  # type: ignore[attr-defined]
        produce_digits(bootstrap_servers, topics.samples, 5, start=30)
        outcomes = read_outcomes(bootstrap_servers, topic_prefix, expected=35)
        assert min(outcomes.by_record().values()) == 1 and outcomes.duplicates()[1] == 0
    down = {**env, "FERRET_REDIS_URL": own_valkey.url, "FERRET_REDIS_TIMEOUT_S": "0.5"}
    own_valkey.stop()
    with trainer_in_process(down):
        assert health(down["FERRET_CONTROL_LISTEN"], SNAPSHOTS) == health_pb2.HealthCheckResponse.NOT_SERVING
        produce_digits(bootstrap_servers, topics.samples, 5, start=35)
        outcomes = read_outcomes(bootstrap_servers, topic_prefix, expected=40)
        assert len(outcomes.by_record()) == 40 and outcomes.duplicates()[1] == 0


def test_kill_9_mid_record_recovers_with_every_re_emission_flagged(
    bootstrap_servers: str, redis_url: str, topic_prefix: str, tmp_path: Path
) -> None:
    """``ferret run`` SIGKILLed after training its 150th item, before publishing its outcome; a new process
    resumes from the committed offsets: every record gets an outcome, every extra copy is flagged
    duplicate, and the time from the kill to the next prediction is measured (docs/reliability.md)."""
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    topics = TopicNames(topic_prefix)
    total = 400
    produce_digits(bootstrap_servers, topics.samples, total)
    env = trainer_env(bootstrap_servers, redis_url, topic_prefix)
    log = tmp_path / "trainer.log"
    first = TrainerCommand({**env, "FERRET_FAILPOINT": "trainer.mid-record:kill@150"}, log)
    assert first.wait_exit(120) == -9
    killed = time.time()
    second = TrainerCommand(env, log)
    try:
        outcomes = read_outcomes(bootstrap_servers, topic_prefix, expected=total, timeout_s=120)
        after = sorted(p.predicted_time_ms for p in outcomes.predictions if p.predicted_time_ms / 1000 > killed)
        assert after, "no prediction after the kill"
        recovery_s = after[0] / 1000 - killed
        print(f"kill -9 → next prediction: {recovery_s:.2f} s")
        by_record = outcomes.by_record()
        flagged, unflagged = outcomes.duplicates()
        print(f"records {total}, outcomes {sum(by_record.values())}, flagged {flagged}, unflagged {unflagged}")
        assert len(by_record) == total and unflagged == 0
    finally:
        assert second.stop() == 0


def _take_producer_ids(bootstrap: str, topic: str, count: int) -> None:
    """``count`` idempotent producers, one after another, each writing one Label no sample matches (the
    trainer counts it unmatched): a broker that lost its producer ids hands out 1..count again."""
    for i in range(count):
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        producer.produce(topic, messages_pb2.Label(sample_id=f"nobody/{i}", label=0).SerializeToString())
        assert producer.flush(30) == 0


@pytest.mark.parametrize(
    ("taken_ids", "stall_s", "seen"),
    # fatal: whichever of its paths librdkafka reports first (poll()'s OUT_OF_ORDER_SEQUENCE_NUMBER, or produce()'s
    # _FATAL "Fatal error" when the next produce comes before the next poll) rebuilds; both were seen here
    [(0, 3.0, "no delivery reported"), (3, 120.0, "OUT_OF_ORDER_SEQUENCE_NUMBER|Fatal error")],
    ids=["stalled-producer", "fatal-producer"],
)
def test_the_trainer_carries_on_after_a_broker_restart(
    redis_url: str,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    taken_ids: int,
    stall_s: float,
    seen: str,
) -> None:
    """A memory-only broker restarted under a running trainer (every topic, offset and producer id lost):
    the trainer's clients reconnect, its producer is rebuilt, and every record produced after the restart
    gets an outcome, any second copy flagged; the trainer never stops. Two ways the producer goes:

    - ``stalled-producer``: the restarted broker does not know the producer's id; librdkafka's idempotent
      producer loops on UNKNOWN_PRODUCER_ID without reporting anything, and the publisher rebuilds it after
      ``STALL_S`` (publisher.py).
    - ``fatal-producer``: the restarted broker first hands the ids 1..3 to other clients, the trainer's among
      them (the samples' producer took 1, the trainer's 2, before the restart): the trainer's next batch is
      refused ``OUT_OF_ORDER_SEQUENCE_NUMBER``, ``poll()`` raises it as fatal and ``produce()`` raises
      ``_FATAL`` (issue 26: the trainer exited 1). The stall time is set far beyond the test, so only the
      fatal path can rebuild."""
    monkeypatch.setattr(publisher_module, "STALL_S", stall_s)  # 15 s in production
    caplog.set_level(logging.INFO, logger="ferret.trainer")
    broker = TansuBroker(tmp_path / "broker", port=free_port()).start()
    bootstrap = broker.bootstrap_servers
    try:
        ensure_topics(bootstrap, topic_prefix, sample_partitions=2)
        topics = TopicNames(topic_prefix)
        produce_digits(bootstrap, topics.samples, 30)
        env = trainer_env(bootstrap, redis_url, topic_prefix)
        with trainer_in_process(env) as trainer:
            assert len(read_outcomes(bootstrap, topic_prefix, expected=30).by_record()) == 30
            broker.stop()
            time.sleep(1.0)  # the clients see the broker gone
            broker.start()
            restarted = time.monotonic()
            ensure_topics(bootstrap, topic_prefix, sample_partitions=2)
            _take_producer_ids(bootstrap, topics.labels, taken_ids)
            produce_digits(bootstrap, topics.samples, 30, start=30)
            outcomes = read_outcomes(bootstrap, topic_prefix, expected=30, timeout_s=90)
            by_record = outcomes.by_record()
            flagged, unflagged = outcomes.duplicates()
            publisher = trainer.process.parts.stream._publisher
            assert publisher is not None
            print(f"broker restart ({seen}): 30 records after it, {sum(by_record.values())} outcomes, "
                  f"{flagged} flagged, {unflagged} unflagged duplicates; producer rebuilds {publisher.rebuilds}, "
                  f"resent {publisher.resent} ({publisher.resent_flagged} flagged); all outcomes read "
                  f"{time.monotonic() - restarted:.1f} s after the restart")  # fmt: skip
            assert len(by_record) == 30 and unflagged == 0, by_record
            assert publisher.rebuilds >= 1 and re.search(seen, caplog.text)
            assert trainer.error is None
            produce_digits(bootstrap, topics.samples, 5, start=60)  # and it goes on
            assert len(read_outcomes(bootstrap, topic_prefix, expected=35).by_record()) == 35
            assert trainer.error is None and trainer.thread.is_alive()
    finally:
        broker.stop()


def test_a_wrong_redis_password_fails_the_start_unless_snapshots_are_optional(
    bootstrap_servers: str, topic_prefix: str, password_valkey: PasswordValkey, tmp_path: Path
) -> None:
    """``ferret run`` against a Redis that refuses its password exits 1 with one line naming redis.url and
    both fixes (never the password), instead of running for good without snapshots; with
    ``redis.optional`` it starts degraded (``ferret.snapshots`` NOT_SERVING) and predicts."""
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    env = trainer_env(bootstrap_servers, password_valkey.url_with("wrong-password-0815"), topic_prefix)
    done = subprocess.run(
        [*FERRET, "run", "--log-level", "ERROR"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("ferret: error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Redis refused the credentials" in lines[0] and "redis.optional" in lines[0]
    assert "wrong-password-0815" not in done.stderr
    optional = {**env, "FERRET_REDIS_OPTIONAL": "true"}
    with trainer_in_process(optional) as trainer:
        assert health(optional["FERRET_CONTROL_LISTEN"], SNAPSHOTS) == health_pb2.HealthCheckResponse.NOT_SERVING
        produce_digits(bootstrap_servers, TopicNames(topic_prefix).samples, 5)
        assert len(read_outcomes(bootstrap_servers, topic_prefix, expected=5).by_record()) == 5
        assert trainer.error is None


def test_snapshots_written_unsigned_are_not_restored_by_a_trainer_with_a_key(
    bootstrap_servers: str, redis_url: str, topic_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A trainer that opted in to unsigned snapshots (``redis.allow_unsigned``, a warning at start) writes
    them unsigned; a trainer of the same replica started with a key refuses them (anyone could have written
    their offsets) and starts fresh, saying why; its own snapshots are signed and restored."""
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    env = trainer_env(bootstrap_servers, redis_url, topic_prefix)
    unsigned = {k: v for k, v in env.items() if k != "FERRET_REDIS_HMAC_KEY"} | {"FERRET_REDIS_ALLOW_UNSIGNED": "true"}
    produce_digits(bootstrap_servers, TopicNames(topic_prefix).samples, 10)
    with caplog.at_level("WARNING"), trainer_in_process(unsigned) as first:
        read_outcomes(bootstrap_servers, topic_prefix, expected=10)
        assert first.process.parts.port.save_snapshot({}).version == 1
    assert "snapshots are unsigned (redis.allow_unsigned: true)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"), trainer_in_process(env) as keyed:
        assert keyed.status().last_snapshot_version == 0  # type: ignore[attr-defined]
        assert keyed.process.parts.port.save_snapshot({}).version == 3  # v2: the first one's shutdown snapshot
    skipped = "skipped v2 (corrupt: snapshot v2 of replica-0: snapshot manifest is unsigned, but a signing key"
    assert skipped in caplog.text
    with trainer_in_process(env) as again:
        assert again.status().last_snapshot_version == 4  # type: ignore[attr-defined]  # the keyed shutdown's
def _paced_digits(bootstrap: str, topic: str, start: int, count: int, rate: float) -> None:
    """``count`` digits items at ``rate`` per second, each stamped with its send time."""
    from ferret_core.data import load_dataset

    ds = load_dataset("digits", None)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    began = time.monotonic()
    for seq in range(start, start + count):
        time.sleep(max(0.0, began + (seq - start) / rate - time.monotonic()))
        x = (ds.x_train[seq % len(ds.x_train)] * 255).astype(np.uint8)
        sample = encode_sample(x, stream="digits", sequence=seq, label=int(ds.y_train[seq % len(ds.y_train)]))
        producer.produce(topic, sample.SerializeToString(), key=sample.id.encode())
        producer.poll(0)
    assert producer.flush(30) == 0


class HealthWatch:
    """Readiness and ``ferret.snapshots`` read through grpc.health.v1 every 50 ms on a thread, with when."""

    def __init__(self, target: str) -> None:
        self.readings: list[tuple[float, int, int]] = []  # (monotonic s, readiness, snapshots)
        self._stop = threading.Event()
        self._channel = grpc.insecure_channel(target)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        stub = health_pb2_grpc.HealthStub(self._channel)
        while not self._stop.is_set():
            ready, snapshots = (
                stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status for name in ("", SNAPSHOTS)
            )
            self.readings.append((time.monotonic(), int(ready), int(snapshots)))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._channel.close()

    def during(self, start: float, end: float) -> list[tuple[float, int, int]]:
        return [r for r in self.readings if start <= r[0] <= end]


def test_a_frozen_redis_never_stalls_predictions_and_health_reports_the_stuck_write(
    bootstrap_servers: str, topic_prefix: str, own_valkey: RedisServer
) -> None:
    """Valkey SIGSTOPped for 6 s under a trainer that snapshots every 0.5 s while 40 items/s stream in: no
    prediction waits behind Redis (the largest gap between consecutive predictions stays below
    ``redis.stall_s``, 1 s here, with ``redis.timeout_s`` 3 s), readiness stays SERVING, ``ferret.snapshots``
    goes NOT_SERVING while the write is stuck, and after SIGCONT snapshots are saved again."""
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    topics = TopicNames(topic_prefix)
    env = trainer_env(
        bootstrap_servers,
        own_valkey.url,
        topic_prefix,
        FERRET_REDIS_TIMEOUT_S="3",
        FERRET_REDIS_STALL_S="1",
        FERRET_REDIS_SNAPSHOT_INTERVAL_S="0.5",
    )
    produce_digits(bootstrap_servers, topics.samples, 20)
    rate, seconds, frozen_s = 40.0, 12.0, 6.0
    with trainer_in_process(env) as trainer:
        read_outcomes(bootstrap_servers, topic_prefix, expected=20)
        watch = HealthWatch(env["FERRET_CONTROL_LISTEN"])
        stream = threading.Thread(
            target=_paced_digits, args=(bootstrap_servers, topics.samples, 20, int(rate * seconds), rate)
        )
        stream.start()
        time.sleep(3.0)
        assert own_valkey.pid is not None
        versions_before = trainer.status().last_snapshot_version  # type: ignore[attr-defined]
        frozen_at = time.monotonic()
        frozen_ms = time.time() * 1000
        os.kill(own_valkey.pid, signal.SIGSTOP)
        try:
            time.sleep(frozen_s)
        finally:
            os.kill(own_valkey.pid, signal.SIGCONT)
        thawed_at = time.monotonic()
        thawed_ms = time.time() * 1000
        stream.join(60)
        total = 20 + int(rate * seconds)
        outcomes = read_outcomes(bootstrap_servers, topic_prefix, expected=total, timeout_s=60)
        wait_for(lambda: trainer.status().last_snapshot_version > versions_before + 1, 30, "a snapshot after SIGCONT")  # type: ignore[attr-defined]
        watch.stop()
        times = sorted(p.predicted_time_ms for p in outcomes.predictions if p.sequence >= 20)
        gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
        gap_ms, gap_at = max(gaps)
        frozen_gap_ms = max(g for g, at in gaps if frozen_ms - 1000 <= at <= thawed_ms)
        readings = watch.during(frozen_at, thawed_at)
        not_ready = sum(r[1] != health_pb2.HealthCheckResponse.SERVING for r in readings)
        snapshots_down = [r[0] - frozen_at for r in readings if r[2] != health_pb2.HealthCheckResponse.SERVING]
        print(
            f"frozen Redis {frozen_s:.0f} s (timeout 3 s, stall 1 s): largest prediction gap {gap_ms} ms "
            f"({(gap_at - frozen_ms) / 1000:+.1f} s from the freeze), during the freeze {frozen_gap_ms} ms; "
            f"readiness NOT_SERVING in {not_ready}/{len(readings)} readings; ferret.snapshots NOT_SERVING from "
            f"{min(snapshots_down, default=float('nan')):.2f} s after the freeze; snapshot "
            f"v{trainer.status().last_snapshot_version} after SIGCONT (v{versions_before} before)"  # type: ignore[attr-defined]
        )
        assert len(outcomes.by_record()) == total and outcomes.duplicates() == (0, 0)
        assert gap_ms <= 1000, f"a prediction waited {gap_ms} ms (redis.stall_s is 1 s)"
        assert not_ready == 0 and readings, readings
        assert snapshots_down and min(snapshots_down) <= 1.0 + 0.5 + 1.0, readings  # stall_s + interval + slack
        assert watch.readings[-1][2] == health_pb2.HealthCheckResponse.SERVING
        assert trainer.error is None
