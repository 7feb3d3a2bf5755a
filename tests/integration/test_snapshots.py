"""Snapshots in a real Redis (the embedded Valkey; a Redis container when Docker answers)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import redis
import torch
from torch import nn

from ferret_core.plan import Partition, Plan, WorkerConfig
from services.snapshots import (
    SnapshotCorruptError,
    SnapshotNotFoundError,
    SnapshotPayload,
    SnapshotStore,
    SnapshotWriteError,
)

pytestmark = pytest.mark.integration


def mnistnet() -> nn.Sequential:
    """The layers of the zoo's MNISTNet (1,199,882 parameters)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(9216, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def a_plan() -> Plan:
    worker = WorkerConfig(index=0, live=True, recompute=False, accumulation=(1, 2), omission=(0, 1))
    return Plan(
        model="mnistnet",
        partition=Partition((0, 2, 4)),
        workers=(worker, WorkerConfig(index=1, live=False, recompute=True, accumulation=(1, 1), omission=(0, 0))),
        arrival_interval=0.004,
        decay=0.1,
        stage_forward_time=0.002,
        stage_backward_time=0.004,
        adaptation_rate=0.5,
        planned_bytes=9_600_000,
        paper_memory_elements=2_400_000,
        min_feasible_bytes=5_000_000,
        budget_bytes=16 * 2**20,
        memory_model="paper",
        dtype="float32",
    )


def trained_state() -> dict[str, torch.Tensor]:
    """Model and Adam state after one step, under flattened names."""
    model = mnistnet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for parameter in model.parameters():  # a step on random gradients fills Adam's state cheaply
        parameter.grad = torch.randn_like(parameter)
    optimizer.step()
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            tensors[f"optim.state.{index}.{key}"] = value
    tensors["comp.fisher.0"] = torch.rand(32, 1, 3, 3)
    return tensors


def small_payload(value: float, *, size: int = 5000) -> SnapshotPayload:
    return SnapshotPayload(tensors={"w": torch.full((size,), value)}, counters={"seen": int(value)})


def assert_same_tensors(got: dict[str, torch.Tensor] | object, want: dict[str, torch.Tensor]) -> None:
    assert isinstance(got, dict) and set(got) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)


def chunk_keys(client: redis.Redis, store: SnapshotStore, version: int) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{store.chunk_key(version, 0)[:-1]}*"))


def test_round_trip_of_a_trained_model(any_redis: redis.Redis) -> None:
    tensors = trained_state()
    plan = a_plan()
    payload = SnapshotPayload(
        tensors=tensors,
        plan=plan.to_dict(),
        offsets={"ferret.samples": {0: 1200, 1: 1187}},
        counters={"labelled": 2387, "correct": 2101, "online_accuracy": 2101 / 2387},
        compensator={"name": "iter-fisher", "decay": 0.1, "steps": 2387},
        meta={"model_version": 812},
    )
    store = SnapshotStore(any_redis, "ferret", "trainer-0")
    version = store.save(payload)
    assert version == 1 and store.latest_version() == 1 and store.list_versions() == [1]

    loaded = store.load()
    assert loaded.version == 1
    assert_same_tensors(dict(loaded.tensors), tensors)
    assert Plan.from_dict(loaded.plan) == plan
    assert loaded.offsets == {"ferret.samples": {0: 1200, 1: 1187}}
    assert loaded.counters == payload.counters and isinstance(loaded.counters["labelled"], int)
    assert loaded.compensator == payload.compensator and loaded.meta == payload.meta

    manifest = store.manifest(1)
    assert manifest.tensors["model.6.weight"] == {"shape": [128, 9216], "dtype": "float32"}
    assert manifest.total_bytes > 4 * 1_199_882  # weights + two Adam moments + the Fisher tensor


def test_values_are_chunked_below_the_chunk_size(redis_client: redis.Redis) -> None:
    store = SnapshotStore(redis_client, "ferret", "trainer-0", chunk_bytes=4096)
    version = store.save(small_payload(3.0))  # 20 kB of floats
    manifest = store.manifest(version)
    keys = chunk_keys(redis_client, store, version)
    assert len(manifest.chunks) == len(keys) >= 5
    assert all(redis_client.strlen(k) <= 4096 for k in keys)
    assert sum(redis_client.strlen(k) for k in keys) == manifest.total_bytes
    assert_same_tensors(dict(store.load(version).tensors), {"w": torch.full((5000,), 3.0)})


def test_a_corrupt_or_missing_chunk_is_detected_and_the_previous_version_used(redis_client: redis.Redis) -> None:
    store = SnapshotStore(redis_client, "ferret", "trainer-0", chunk_bytes=4096)
    good = store.save(small_payload(1.0))
    bad = store.save(small_payload(2.0))
    key = store.chunk_key(bad, 2)
    original = redis_client.get(key)
    assert isinstance(original, bytes)
    redis_client.set(key, bytes([original[0] ^ 0xFF]) + original[1:])  # one flipped byte
    with pytest.raises(SnapshotCorruptError, match="chunk 2 is corrupt"):
        store.load()
    fallback = store.load_latest_valid()
    assert fallback.version == good and fallback.counters == {"seen": 1}

    redis_client.delete(key)
    with pytest.raises(SnapshotCorruptError, match="chunk 2 is missing"):
        store.load(bad)
    statuses = store.list_snapshots(verify=True)
    assert [(s.version, s.valid) for s in statuses] == [(bad, False), (good, True)]
    assert [s.valid for s in store.list_snapshots()] == [True, True]  # manifests alone look fine

    redis_client.delete(store.manifest_key(good))
    with pytest.raises(SnapshotNotFoundError, match="no valid snapshot"):
        store.load_latest_valid()


@pytest.mark.parametrize("failing_step", ["_put_chunks", "_commit_version"])
def test_a_failed_save_leaves_latest_and_no_chunks(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, failing_step: str
) -> None:
    store = SnapshotStore(redis_client, "ferret", "trainer-0", chunk_bytes=4096)
    first = store.save(small_payload(1.0))
    real_put = store._put_chunks

    def crash_after_two_chunks(version: int, chunks: Sequence[memoryview]) -> None:
        real_put(version, chunks[:2])
        raise ConnectionError("simulated crash while writing chunks")

    def crash_before_the_switch(version: int, document: bytes) -> None:
        raise ConnectionError("simulated crash before the manifest and latest were written")

    crash = crash_after_two_chunks if failing_step == "_put_chunks" else crash_before_the_switch
    monkeypatch.setattr(store, failing_step, crash)
    with pytest.raises(SnapshotWriteError, match="latest is unchanged"):
        store.save(small_payload(2.0))
    monkeypatch.undo()

    assert store.latest_version() == first and store.list_versions() == [first]
    assert chunk_keys(redis_client, store, first + 1) == []
    assert redis_client.get(store.manifest_key(first + 1)) is None
    assert store.load().counters == {"seen": 1}
    assert store.save(small_payload(3.0)) == first + 2  # versions are never reused


def test_bad_payloads_are_refused_before_anything_is_written(redis_client: redis.Redis) -> None:
    store = SnapshotStore(redis_client, "ferret", "trainer-0")
    with pytest.raises(SnapshotWriteError, match="cannot serialise"):
        store.save(SnapshotPayload(tensors={"w": [1.0, 2.0]}))  # type: ignore[dict-item]
    with pytest.raises(SnapshotWriteError, match="JSON"):
        store.save(SnapshotPayload(tensors={"w": torch.ones(2)}, counters={"x": float("nan")}))
    assert store.latest_version() is None and redis_client.keys(f"{store.chunk_key(1, 0)[:-8]}*") == []
    with pytest.raises(SnapshotNotFoundError, match="no snapshot of trainer-0"):
        store.load()


def test_two_instance_ids_do_not_collide(redis_client: redis.Redis) -> None:
    a = SnapshotStore(redis_client, "ferret", "trainer-0")
    b = SnapshotStore(redis_client, "ferret", "trainer-1")
    assert a.save(small_payload(1.0)) == 1
    assert b.save(small_payload(2.0)) == 1
    assert a.save(small_payload(3.0)) == 2
    assert (a.load().counters, b.load().counters) == ({"seen": 3}, {"seen": 2})
    assert (a.list_versions(), b.list_versions()) == ([1, 2], [1])
    keys_a: Sequence[bytes] = list(redis_client.scan_iter(match="ferret:snap:{trainer-0}:*"))
    keys_b: Sequence[bytes] = list(redis_client.scan_iter(match="ferret:snap:{trainer-1}:*"))
    assert keys_a and keys_b and not set(keys_a) & set(keys_b)


def test_prune_keeps_the_newest(redis_client: redis.Redis) -> None:
    store = SnapshotStore(redis_client, "ferret", "trainer-0", chunk_bytes=4096)
    for value in range(1, 5):
        store.save(small_payload(float(value)))
    assert store.prune(keep=2) == [1, 2]
    assert store.list_versions() == [3, 4]
    assert chunk_keys(redis_client, store, 1) == [] and redis_client.get(store.manifest_key(2)) is None
    assert store.load_latest_valid().version == 4
