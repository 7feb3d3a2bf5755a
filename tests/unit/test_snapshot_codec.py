"""Snapshot bytes without Redis: safe loading, compact tensors, chunking, the manifest, store settings."""

from __future__ import annotations

import io
import pickle

import pytest
import redis
import torch

from ferret_core.errors import ConfigError
from services.snapshots import SnapshotCorruptError, SnapshotManifest, SnapshotStore
from services.snapshots.codec import ChunkInfo, decode_tensors, encode_tensors, sha256_hex, split


class Gadget:
    """Stands for anything that is not plain data: weights_only must refuse to build it."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def test_tensors_round_trip_exactly() -> None:
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.tensor(2.5)}
    decoded = decode_tensors(encode_tensors(tensors))
    assert set(decoded) == set(tensors)
    for name, tensor in tensors.items():
        torch.testing.assert_close(decoded[name], tensor, rtol=0, atol=0)


def test_a_view_is_written_without_its_whole_storage() -> None:
    big = torch.zeros(1_000_000)
    data = encode_tensors({"row": big[:10], "strided": torch.zeros(100, 100)[:, 0]})
    assert len(data) < 10_000
    assert decode_tensors(data)["strided"].shape == (100,)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickled_objects_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(1), "gadget": Gadget()}, buffer)
    with pytest.raises(SnapshotCorruptError, match="cannot be read safely"):
        decode_tensors(buffer.getvalue())
    with pytest.raises(SnapshotCorruptError):
        decode_tensors(pickle.dumps({"w": 1}))
    plain = io.BytesIO()
    torch.save({"w": [1, 2]}, plain)  # loads under weights_only but is not {name: tensor}
    with pytest.raises(SnapshotCorruptError, match="not a"):
        decode_tensors(plain.getvalue())
    assert "must never run" not in capsys.readouterr().out


def test_non_tensors_are_refused_on_encode() -> None:
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        encode_tensors({"w": [1.0]})  # type: ignore[dict-item]


def test_split_covers_the_data_in_bounded_chunks() -> None:
    data = bytes(range(256)) * 40
    chunks = list(split(data, 1000))
    assert [len(c) for c in chunks] == [1000] * 10 + [240]
    assert b"".join(chunks) == data
    assert [len(c) for c in split(b"", 1000)] == [0]


def manifest() -> SnapshotManifest:
    return SnapshotManifest(
        version=3,
        instance_id="trainer-0",
        created_time_ms=1_790_000_000_000,
        chunks=(ChunkInfo(0, 10, sha256_hex(b"0123456789")),),
        total_bytes=10,
        sha256=sha256_hex(b"0123456789"),
        tensors={"w": {"shape": [10], "dtype": "uint8"}},
        plan={"model": "mlp"},
        offsets={"ferret.samples": {0: 5, 11: 7}},
        counters={"correct": 4, "online_accuracy": 0.5},
        compensator={"name": "none"},
        meta={"note": "x"},
    )


def test_manifest_json_round_trip() -> None:
    original = manifest()
    assert SnapshotManifest.from_json(original.to_json()) == original
    assert original.created_at.startswith("2026-")


@pytest.mark.parametrize("raw", [b"{", b"[]", b'{"format": 99}', b'{"format": 1, "version": 1}'])
def test_malformed_manifests_are_corrupt(raw: bytes) -> None:
    with pytest.raises(SnapshotCorruptError, match="manifest is malformed"):
        SnapshotManifest.from_json(raw)


def test_store_settings_are_validated() -> None:
    client = redis.Redis()  # connects lazily: nothing is sent here
    with pytest.raises(ConfigError, match="instance id"):
        SnapshotStore(client, "ferret", "a:b")
    with pytest.raises(ConfigError, match="namespace"):
        SnapshotStore(client, "", "trainer-0")
    with pytest.raises(ConfigError, match="chunk_bytes"):
        SnapshotStore(client, "ferret", "trainer-0", chunk_bytes=1024**3)
    with pytest.raises(ConfigError, match="decode_responses"):
        SnapshotStore(redis.Redis(decode_responses=True), "ferret", "trainer-0")
    store = SnapshotStore(client, "ferret", "trainer-0")
    assert store.chunk_key(2, 5) == "ferret:snap:{trainer-0}:v2:chunk:5"
    assert store.latest_key == "ferret:snap:{trainer-0}:latest"
