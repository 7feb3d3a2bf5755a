"""The trainer's model-stream publisher (off the record path, bounded, latest wins) and the stream's
update assembly (whole updates only, trimmed heads skipped, checksums checked), without Redis."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping

import pytest
import redis
import torch

from services.serving.export_files import decode_weights
from services.serving.model_card import ModelCard
from services.serving.model_stream import _assemble
from services.trainer.model_updates import ModelPublisher

CARD = ModelCard("mlp", (4,), 3)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeWriter:
    """Records publishes; ``gate`` (when given) holds each publish until set, as a slow Redis would."""

    key = "ns:models:{r0}"

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.gate = gate
        self.fail = fail
        self.published: list[tuple[int, int, bytes]] = []
        self.lineages: list[int] = []

    def publish(self, version: int, update_ms: int, card: ModelCard, data: bytes, lineage: int = 0) -> int:
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail:
            raise redis.ConnectionError("Redis is down")
        self.published.append((version, update_ms, data))
        self.lineages.append(lineage)
        return len(data)


class Master:
    """A learner's ``master_tensors`` with a version the test moves; counts the captures."""

    def __init__(self) -> None:
        self.version = 1
        self.lineage = 1000
        self.captures = 0

    def __call__(self) -> Mapping[str, torch.Tensor]:
        self.captures += 1
        return {
            "model.0.weight": torch.full((3, 4), float(self.version)),
            "engine.updates": torch.tensor(self.version),
            "engine.lineage": torch.tensor(self.lineage),
        }


def publisher(writer: FakeWriter, master: Master, clock: Clock, interval_s: float = 1.0) -> ModelPublisher:
    return ModelPublisher(master, writer, CARD, interval_s, clock=clock)  # type: ignore[arg-type]


def test_an_update_is_captured_once_per_interval_and_written_off_the_loop() -> None:
    writer, master, clock = FakeWriter(), Master(), Clock()
    p = publisher(writer, master, clock)
    p.tick()  # due at once
    assert p.flush(5)
    clock.now = 0.5
    master.version = 2
    p.tick()  # not due yet: nothing captured
    assert master.captures == 1
    clock.now = 1.0
    p.tick()
    assert p.flush(5)
    p.close()
    assert [v for v, _, _ in writer.published] == [1, 2]
    weights = decode_weights(writer.published[1][2], "test")
    assert torch.equal(weights["0.weight"], torch.full((3, 4), 2.0))  # <unit>.<name>, no engine.updates
    assert p.stats().published == 2 and p.stats().last_version == 2


def test_an_unchanged_version_is_not_published_again() -> None:
    writer, master, clock = FakeWriter(), Master(), Clock()
    p = publisher(writer, master, clock)
    p.tick()
    assert p.flush(5)
    clock.now = 5.0
    p.tick()
    p.close()
    assert len(writer.published) == 1


def test_a_rollback_to_the_same_version_number_is_a_new_lineage_and_is_published() -> None:
    """A rollback (or restore) lands on a version number already published, with other weights: the pair
    (lineage, version) differs, so the update goes out and serving follows it."""
    writer, master, clock = FakeWriter(), Master(), Clock()
    p = publisher(writer, master, clock)
    p.tick()
    assert p.flush(5)
    master.lineage = 2000  # the version number stays 1
    clock.now = 5.0
    p.tick()
    p.close()
    assert [v for v, _, _ in writer.published] == [1, 1]
    assert writer.lineages == [1000, 2000]


def test_a_slow_write_makes_the_loop_skip_updates_never_wait() -> None:
    gate = threading.Event()
    writer, master, clock = FakeWriter(gate), Master(), Clock()
    p = publisher(writer, master, clock)
    p.tick()  # the write hangs on the gate
    for step in range(1, 4):
        clock.now, master.version = float(step), step + 1
        p.tick()  # returns at once: the previous update is still being written
    assert p.stats().skipped_busy == 3
    assert master.captures == 1  # skipped ticks copy nothing
    gate.set()
    assert p.flush(5)
    p.close()
    assert [v for v, _, _ in writer.published] == [1]


def test_a_failing_redis_is_counted_and_the_next_update_tries_again() -> None:
    writer, master, clock = FakeWriter(fail=True), Master(), Clock()
    p = publisher(writer, master, clock)
    p.tick()
    assert p.flush(5)
    writer.fail = False
    clock.now, master.version = 1.0, 2
    p.tick()
    assert p.flush(5)
    p.close()
    assert p.stats().failures == 1 and [v for v, _, _ in writer.published] == [2]


def test_interval_zero_is_refused_here_the_setting_turns_the_publisher_off() -> None:
    from ferret_core.errors import ConfigError

    with pytest.raises(ConfigError, match="0 turns it off"):
        publisher(FakeWriter(), Master(), Clock(), interval_s=0)


def entries(version: int, data: bytes, chunk: int, first_id: int = 1) -> list[tuple[bytes, dict[bytes, bytes]]]:
    parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    digest = hashlib.sha256(data).hexdigest().encode()
    out = []
    for n, part in enumerate(parts):
        fields = {b"v": str(version).encode(), b"n": str(n).encode(), b"of": str(len(parts)).encode(), b"t": b"5",
                  b"p": b"6", b"h": digest, b"d": part}  # fmt: skip
        if n == 0:
            fields[b"c"] = json.dumps(CARD.to_dict()).encode()
        out.append((f"{first_id + n}-0".encode(), fields))
    return out


def test_updates_are_assembled_from_their_chunks_and_a_trimmed_head_is_skipped() -> None:
    one, two = b"a" * 10, b"b" * 7
    stream = entries(1, one, 4)[1:] + entries(2, two, 4, first_id=10)  # update 1 lost its first chunk (trimmed)
    updates = list(_assemble(stream))
    assert [(u.version, u.data, u.entry_id) for u in updates] == [(2, two, b"11-0")]
    assert updates[0].card == CARD and updates[0].update_ms == 5


def test_an_update_whose_bytes_differ_from_its_checksum_is_corrupt() -> None:
    from services.serving.errors import ModelStreamError

    stream = entries(3, b"c" * 9, 4)
    stream[1][1][b"d"] = b"XXXX"
    with pytest.raises(ModelStreamError, match="sha256"):
        list(_assemble(stream))


def test_the_publishers_counters_reach_prometheus() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from services.trainer.model_updates import ModelStreamCollector

    writer, master, clock = FakeWriter(), Master(), Clock()
    p = publisher(writer, master, clock)
    p.tick()
    assert p.flush(5)
    p.close()
    registry = CollectorRegistry()
    registry.register(ModelStreamCollector(p.stats))
    text = generate_latest(registry).decode()
    assert "ferret_model_stream_published_total 1.0" in text and "ferret_model_stream_version 1.0" in text
    assert f"ferret_model_stream_update_bytes {float(len(writer.published[0][2]))}" in text
