"""Bad snapshot state, Redis down, a frozen Redis and a writer killed mid-write, against a real Valkey.

Each test guards one failure: start-up must not raise a traceback on bad state (garbage ``latest``,
non-numeric ``versions``, a malformed plan, a tensor of the wrong shape, a changed model), pruning must
not delete the only valid snapshot, and forged offsets must be refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
import torch

from services import failpoints
from services.control.health import ControlHealth
from services.localstack.redis_server import RedisServer
from services.snapshots import (
    Backoff,
    ModelFingerprint,
    Reconnect,
    SnapshotAuthError,
    SnapshotPayload,
    SnapshotStore,
    SnapshotUnavailableError,
    SnapshotWriteError,
    redis_client,
)
from tests.integration.test_snapshots import a_plan
from tests.reliability.conftest import REDIS_PASSWORD, PasswordValkey

pytestmark = pytest.mark.integration

KEY = b"0123456789abcdef-test-key"


def model_tensors(width: int = 4, fill: float = 1.0) -> dict[str, torch.Tensor]:
    return {
        "model.0.weight": torch.full((width, 3), fill),
        "model.0.bias": torch.full((width,), fill),
        "engine.updates": torch.tensor(7),
    }


def payload(fill: float = 1.0, width: int = 4, offset: int = 10) -> SnapshotPayload:
    return SnapshotPayload(
        tensors=model_tensors(width, fill), plan=a_plan().to_dict(), offsets={"t.samples": {0: offset}}
    )


FINGERPRINT = ModelFingerprint.of("mnistnet", model_tensors())


def rewrite_manifest(client: redis.Redis, store: SnapshotStore, version: int, **changes: object) -> None:
    document = json.loads(client.get(store.manifest_key(version)))
    document.update(changes)
    client.set(store.manifest_key(version), json.dumps(document))


@pytest.fixture
def store(redis_client: redis.Redis) -> SnapshotStore:
    return SnapshotStore(redis_client, "ferret", "trainer-0", chunk_bytes=64)


# -- start-up on bad state: the newest valid, compatible snapshot, the rest reported --------------------


def test_garbage_latest_key_falls_back_to_the_versions(store: SnapshotStore, redis_client: redis.Redis) -> None:
    store.save(payload(1.0))
    store.save(payload(2.0))
    redis_client.set(store.latest_key, b"\x00garbage")
    choice = store.newest_compatible(FINGERPRINT)
    assert choice.payload is not None and choice.payload.version == 2
    assert store.save(payload(3.0)) == 3  # the commit script survives the garbage pointer
    assert store.latest_version() == 3


def test_non_numeric_versions_entry_is_ignored_and_pruned(store: SnapshotStore, redis_client: redis.Redis) -> None:
    store.save(payload(1.0))
    redis_client.zadd(store.versions_key, {b"abc": 99, b"-3": 100})
    choice = store.newest_compatible(FINGERPRINT)
    assert choice.payload is not None and choice.payload.version == 1
    assert store.prune(keep=1) == []
    assert redis_client.zrange(store.versions_key, 0, -1) == [b"1"]


def test_malformed_plan_is_skipped_as_corrupt(store: SnapshotStore, redis_client: redis.Redis) -> None:
    store.save(payload(1.0))
    store.save(payload(2.0))
    rewrite_manifest(redis_client, store, 2, plan={"model": "mnistnet", "partition": "zero"})
    choice = store.newest_compatible(FINGERPRINT)
    assert choice.payload is not None and choice.payload.version == 1
    assert [(s.version, s.kind) for s in choice.skipped] == [(2, "corrupt")]
    assert "plan is malformed" in choice.skipped[0].reason


def test_tensor_of_the_wrong_shape_is_skipped(store: SnapshotStore, redis_client: redis.Redis) -> None:
    store.save(payload(1.0))
    store.save(payload(2.0, width=5))  # the chunks hold a 5x3 weight ...
    summary = json.loads(redis_client.get(store.manifest_key(2)))["tensors"]
    summary["model.0.weight"]["shape"], summary["model.0.bias"]["shape"] = [4, 3], [4]
    rewrite_manifest(redis_client, store, 2, tensors=summary)  # ... the manifest claims 4x3
    choice = store.newest_compatible(FINGERPRINT)
    assert choice.payload is not None and choice.payload.version == 1
    assert choice.skipped[0].kind == "corrupt" and "the manifest says float32[4, 3]" in choice.skipped[0].reason


def test_changed_model_starts_fresh_and_reports_every_snapshot(store: SnapshotStore) -> None:
    store.save(payload(1.0))
    store.save(payload(2.0))
    other_width = ModelFingerprint.of("mnistnet", model_tensors(width=8))
    choice = store.newest_compatible(other_width)
    assert choice.payload is None
    assert [(s.version, s.kind) for s in choice.skipped] == [(2, "incompatible"), (1, "incompatible")]
    assert "model.0.weight is float32[4, 3], expected float32[8, 3]" in choice.skipped[0].reason
    other_model = store.newest_compatible(ModelFingerprint.of("convnet", model_tensors()))
    assert other_model.payload is None and "model 'mnistnet'" in other_model.skipped[0].reason
    assert "incompatible" in other_model.describe()


def test_non_finite_weights_are_never_written_nor_loaded(store: SnapshotStore, redis_client: redis.Redis) -> None:
    with pytest.raises(SnapshotWriteError, match="NaN or inf"):
        store.save(payload(float("nan")))
    assert store.latest_version() is None
    store.save(payload(1.0))
    version = store.save(payload(2.0))
    # a NaN written behind the store's back (same checksums recomputed): the reader refuses it
    from services.snapshots.codec import encode_tensors, sha256_hex

    data = encode_tensors(model_tensors(fill=float("inf")))
    redis_client.delete(*[store.chunk_key(version, i) for i in range(100)])
    chunks = [data[i : i + 64] for i in range(0, len(data), 64)]
    for i, chunk in enumerate(chunks):
        redis_client.set(store.chunk_key(version, i), chunk)
    rewrite_manifest(
        redis_client,
        store,
        version,
        chunks=[{"index": i, "size": len(c), "sha256": sha256_hex(c)} for i, c in enumerate(chunks)],
        chunk_count=len(chunks),
        total_bytes=len(data),
        sha256=sha256_hex(data),
    )
    choice = store.newest_compatible(FINGERPRINT)
    assert choice.payload is not None and choice.payload.version == 1
    assert "NaN or inf" in choice.skipped[0].reason


# -- pruning keeps the newest K valid snapshots ----------------------------------------------------------


def test_pruning_never_deletes_the_only_valid_snapshot(store: SnapshotStore, redis_client: redis.Redis) -> None:
    store.save(payload(1.0))
    for fill in (2.0, 3.0, 4.0):
        version = store.save(payload(fill))
        redis_client.delete(store.chunk_key(version, 0))  # corrupt: a chunk is missing
    fresh = SnapshotStore(redis_client, "ferret", "trainer-0", chunk_bytes=64)  # no memo of verified versions
    assert fresh.prune(keep=3) == []
    assert fresh.load_latest_valid().version == 1
    for fill in (5.0, 6.0, 7.0):
        fresh.save(payload(fill))
    assert fresh.prune(keep=3) == [1, 2, 3, 4]  # three valid newer ones exist: the old and the corrupt go
    assert fresh.list_versions() == [5, 6, 7]


# -- signed manifests -------------------------------------------------------------------------------------


def test_forged_offsets_are_refused_when_signed(redis_client: redis.Redis) -> None:
    signed = SnapshotStore(redis_client, "ferret", "trainer-0", hmac_key=KEY)
    signed.save(payload(1.0, offset=10))
    signed.save(payload(2.0, offset=20))
    rewrite_manifest(redis_client, signed, 2, offsets={"t.samples": {"0": 999_999}})  # skip ahead
    choice = signed.newest_compatible(FINGERPRINT)
    assert choice.payload is not None and choice.payload.offsets == {"t.samples": {0: 10}}
    assert "signature does not match" in choice.skipped[0].reason
    other_key = SnapshotStore(redis_client, "ferret", "trainer-0", hmac_key=b"another-key-of-16-bytes")
    assert other_key.newest_compatible(FINGERPRINT).payload is None
    unsigned_reader = SnapshotStore(redis_client, "ferret", "trainer-0")
    assert unsigned_reader.load(2).offsets == {"t.samples": {0: 999_999}}  # without a key: not checked
    assert "0123456789abcdef" not in repr(signed)


def test_unsigned_manifest_is_refused_when_a_key_is_configured(redis_client: redis.Redis) -> None:
    SnapshotStore(redis_client, "ferret", "trainer-0").save(payload(1.0))
    choice = SnapshotStore(redis_client, "ferret", "trainer-0", hmac_key=KEY).newest_compatible(FINGERPRINT)
    assert choice.payload is None and "unsigned" in choice.skipped[0].reason


# -- Redis down at start, a frozen Redis ----------------------------------------------------------------


def test_redis_down_at_start_degrades_then_recovers(own_valkey: RedisServer) -> None:
    url = own_valkey.url
    own_valkey.stop()
    store = SnapshotStore(redis_client(url, socket_timeout_s=1, connect_timeout_s=0.5), "ferret", "trainer-0")
    changes: list[bool] = []
    link = Reconnect(store.ping, backoff=Backoff(initial_s=0.05, max_s=0.2), on_change=changes.append)
    assert link.check() is False and changes == [False]
    with pytest.raises(SnapshotUnavailableError):
        store.newest_compatible(FINGERPRINT)
    with pytest.raises(SnapshotWriteError):
        store.save(payload(1.0))
    own_valkey.start()
    deadline = time.monotonic() + 10
    while not link.check() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert link.available and changes == [False, True] and link.attempts >= 2
    assert store.save(payload(1.0)) == 1
    assert store.newest_compatible(FINGERPRINT).payload is not None


@pytest.mark.parametrize("password", ["wrong-password-0815", None], ids=["wrong", "none"])
def test_credentials_redis_refuses_at_start_are_an_error_unless_snapshots_are_optional(
    password_valkey: PasswordValkey, password: str | None
) -> None:
    """A Redis that answers but refuses the credentials is a misconfiguration, not an outage: the first
    check raises (naming redis.url and both fixes, never the password) instead of degrading for good;
    with ``optional`` it degrades like an outage."""
    url = password_valkey.url_with(password)
    store = SnapshotStore(redis_client(url, socket_timeout_s=1, connect_timeout_s=0.5), "ferret", "trainer-0")
    with pytest.raises(SnapshotAuthError) as refused:
        Reconnect(store.ping).check()
    message = str(refused.value)
    assert "Redis refused the credentials" in message and "redis.url" in message and "redis.optional" in message
    assert "wrong-password-0815" not in message
    changes: list[bool] = []
    optional = Reconnect(store.ping, on_change=changes.append, optional=True)
    assert optional.check() is False and changes == [False] and "refused the credentials" in optional.last_error
    right = SnapshotStore(redis_client(password_valkey.url_with(REDIS_PASSWORD)), "ferret", "trainer-0")
    assert Reconnect(right.ping).check() is True and right.save(payload(1.0)) == 1


def test_credentials_refused_after_start_degrade_a_running_trainer(password_valkey: PasswordValkey) -> None:
    """A password changed under a running trainer (after its first check) degrades snapshots, as an outage
    does: the trainer keeps predicting, and the refusal is the logged error."""
    client = redis_client(password_valkey.url_with(REDIS_PASSWORD), socket_timeout_s=1, connect_timeout_s=0.5)
    store = SnapshotStore(client, "ferret", "trainer-0")
    link = Reconnect(store.ping, backoff=Backoff(initial_s=0.01, max_s=0.01, jitter=0.0))
    assert link.check() is True
    admin = redis.Redis.from_url(password_valkey.url_with(REDIS_PASSWORD))
    try:
        admin.config_set("requirepass", "rotated-password-1234")
        admin.client_kill_filter(_type="normal", skipme=True)  # the store's connection must log in again
    finally:
        admin.close()
    with pytest.raises(SnapshotWriteError) as failed:
        store.save(payload(1.0))
    link.failed(failed.value)
    time.sleep(0.05)
    assert link.check() is False and "refused the credentials" in link.last_error


def test_frozen_redis_bounds_the_write_and_readiness_reports_it(own_valkey: RedisServer) -> None:
    client = redis_client(own_valkey.url, socket_timeout_s=1.0, connect_timeout_s=0.5)
    store = SnapshotStore(client, "ferret", "trainer-0")
    store.save(payload(1.0))
    health = ControlHealth(ready=True)
    seen_not_ready = threading.Event()

    def watch() -> None:
        while not seen_not_ready.is_set() and not done.is_set():
            if not health.ready:
                seen_not_ready.set()
            time.sleep(0.01)

    done = threading.Event()
    watcher = threading.Thread(target=watch)
    assert own_valkey.pid is not None
    os.kill(own_valkey.pid, signal.SIGSTOP)
    watcher.start()
    try:
        with (
            pytest.raises(SnapshotWriteError, match=r"[Tt]ime(out|d out)"),
            health.readiness_deadline("snapshot write", 0.2),
        ):
            store.save(payload(2.0))
    finally:
        os.kill(own_valkey.pid, signal.SIGCONT)
        done.set()
        watcher.join()
    assert seen_not_ready.is_set()  # readiness went NOT_SERVING while the write was stalled
    assert health.ready  # and came back when it ended
    assert store.latest_version() == 1


# -- failpoints: a writer dies between its chunks and its commit -----------------------------------------

WRITER = """
import sys, torch, redis
from services.snapshots import SnapshotStore, SnapshotPayload
store = SnapshotStore(redis.Redis.from_url(sys.argv[1]), "ferret", "trainer-0", chunk_bytes=64)
store.save(SnapshotPayload(tensors={"model.0.weight": torch.ones(4, 3)}))
print("committed")
"""


def test_writer_killed_mid_write_leaves_latest_unchanged(
    store: SnapshotStore, redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    store.save(payload(1.0))
    env = {**os.environ, failpoints.ENV: "snapshot.mid-write:kill"}
    done = subprocess.run([sys.executable, "-c", WRITER, redis_url], env=env, capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and b"committed" not in done.stdout
    assert store.latest_version() == 1 and store.list_versions() == [1]
    assert redis_client.keys(f"{store.chunk_key(2, 0)}")  # its chunks were left behind ...
    assert store.sweep_orphans() == [2]  # ... and the start-up sweep removes them
    assert not redis_client.keys(f"{store.chunk_key(2, 0)}")
    assert store.save(payload(3.0)) == 3


def test_failpoint_raise_mid_write_discards_the_version(store: SnapshotStore, redis_client: redis.Redis) -> None:
    store.save(payload(1.0))
    failpoints.configure({failpoints.ENV: "snapshot.mid-write"})
    try:
        with pytest.raises(SnapshotWriteError, match=r"failpoint 'snapshot\.mid-write'"):
            store.save(payload(2.0))
    finally:
        failpoints.configure({})
    assert store.latest_version() == 1 and not redis_client.keys(f"{store.chunk_key(2, 0)}")
