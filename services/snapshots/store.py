"""Versioned, chunked snapshots in Redis (DESIGN §4 "Redis snapshot layout").

Keys of one replica (``{…}`` is a Redis Cluster hash tag, so one replica's keys share a slot)::

    <ns>:snap:{<instance>}:seq                 INCR counter that hands out versions
    <ns>:snap:{<instance>}:v<N>:chunk:<k>      bytes k·chunk_bytes … of torch.save({name: tensor})
    <ns>:snap:{<instance>}:v<N>:manifest       JSON: checksums, plan, offsets, counters, … (codec.py)
    <ns>:snap:{<instance>}:versions            sorted set of committed versions
    <ns>:snap:{<instance>}:latest              the newest committed version

``save`` writes every chunk, then one Lua script writes the manifest, adds the version to the set and
moves ``latest`` forward: a failed or interrupted save never becomes visible, and its chunks are
removed. ``load`` checks every chunk's size and sha256 and the total before ``torch.load(...,
weights_only=True)``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import redis

from ferret_core.errors import ConfigError
from services.snapshots.codec import (
    ChunkInfo,
    SnapshotManifest,
    SnapshotPayload,
    decode_tensors,
    encode_tensors,
    now_ms,
    sha256_hex,
    split,
    tensor_summary,
)
from services.snapshots.errors import (
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotWriteError,
)

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 8 * 2**20
MAX_CHUNK_BYTES = 512 * 2**20  # Redis's limit on one value
ROUND_TRIP_BYTES = 64 * 2**20  # chunks sent or fetched per pipeline round trip
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")

# KEYS: manifest, versions, latest. ARGV: manifest JSON, version. Returns 1 when latest moved.
_COMMIT = """
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[2])
local current = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[2]) > current then
  redis.call('SET', KEYS[3], ARGV[2])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class SnapshotStatus:
    """A listed version: its manifest when readable, and whether it verified."""

    version: int
    manifest: SnapshotManifest | None
    valid: bool
    error: str = ""


class SnapshotStore:
    """Snapshots of one trainer replica (``instance_id``) under ``namespace`` in Redis.

    ``redis_client`` must return bytes (``decode_responses=False``). Not safe for two writers with the
    same instance id beyond this guarantee: versions never collide and ``latest`` only moves forward.
    """

    def __init__(
        self,
        redis_client: redis.Redis,
        namespace: str,
        instance_id: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        for what, value in (("namespace", namespace), ("instance id", instance_id)):
            if not _NAME.match(value):
                raise ConfigError(
                    f"invalid snapshot {what} {value!r}: use 1-128 characters from letters, digits, '.', '_' "
                    "and '-' (e.g. ferret, trainer-0)"
                )
        if not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
            raise ConfigError(f"chunk_bytes must be in 1..{MAX_CHUNK_BYTES} (Redis's value limit), got {chunk_bytes}")
        if redis_client.get_connection_kwargs().get("decode_responses"):
            raise ConfigError("the snapshot store needs a Redis client with decode_responses=False (bytes)")
        self._redis = redis_client
        self.namespace = namespace
        self.instance_id = instance_id
        self.chunk_bytes = chunk_bytes
        self._base = f"{namespace}:snap:{{{instance_id}}}"
        self._commit = redis_client.register_script(_COMMIT)

    # -- keys ------------------------------------------------------------------------------------------
    @property
    def latest_key(self) -> str:
        return f"{self._base}:latest"

    @property
    def versions_key(self) -> str:
        return f"{self._base}:versions"

    @property
    def seq_key(self) -> str:
        return f"{self._base}:seq"

    def manifest_key(self, version: int) -> str:
        return f"{self._base}:v{version}:manifest"

    def chunk_key(self, version: int, index: int) -> str:
        return f"{self._base}:v{version}:chunk:{index}"

    # -- writing ---------------------------------------------------------------------------------------
    def save(self, payload: SnapshotPayload) -> int:
        """Write ``payload`` as a new version and point ``latest`` at it; return the version.

        Raises :class:`SnapshotWriteError` (``latest`` unchanged) when anything fails.
        """
        try:
            data = encode_tensors(payload.tensors)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise SnapshotWriteError(f"snapshot of {self.instance_id}: cannot serialise the tensors: {exc}") from exc
        chunks = list(split(data, self.chunk_bytes))
        infos = tuple(ChunkInfo(index=i, size=len(c), sha256=sha256_hex(c)) for i, c in enumerate(chunks))
        try:
            version = int(self._redis.incr(self.seq_key))
        except redis.RedisError as exc:
            raise SnapshotWriteError(f"snapshot of {self.instance_id}: Redis refused a version: {exc}") from exc
        manifest = SnapshotManifest(
            version=version,
            instance_id=self.instance_id,
            created_time_ms=now_ms(),
            chunks=infos,
            total_bytes=len(data),
            sha256=sha256_hex(data),
            tensors=tensor_summary(payload.tensors),
            plan=payload.plan,
            offsets=payload.offsets,
            counters=payload.counters,
            compensator=payload.compensator,
            meta=payload.meta,
        )
        try:
            document = manifest.to_json()
        except (TypeError, ValueError) as exc:
            raise SnapshotWriteError(
                f"snapshot of {self.instance_id}: plan, offsets, counters, compensator and meta must be "
                f"JSON data: {exc}"
            ) from exc
        try:
            self._put_chunks(version, chunks)
            self._commit_version(version, document)
        except BaseException as exc:
            self._discard_chunks(version, len(chunks))
            if isinstance(exc, Exception):
                raise SnapshotWriteError(
                    f"snapshot v{version} of {self.instance_id} failed and was discarded (latest is unchanged): {exc}"
                ) from exc
            raise
        log.info("snapshot v%d of %s: %d bytes in %d chunks", version, self.instance_id, len(data), len(chunks))
        return version

    def _put_chunks(self, version: int, chunks: Sequence[memoryview]) -> None:
        for start, batch in self._batches(len(chunks)):
            pipe = self._redis.pipeline(transaction=False)
            for index in range(start, start + batch):
                pipe.set(self.chunk_key(version, index), chunks[index].tobytes())
            pipe.execute()

    def _commit_version(self, version: int, document: bytes) -> None:
        self._commit(keys=[self.manifest_key(version), self.versions_key, self.latest_key], args=[document, version])

    def _discard_chunks(self, version: int, count: int) -> None:
        try:
            keys = [self.chunk_key(version, i) for i in range(count)]
            for start in range(0, len(keys), 1000):
                self._redis.unlink(*keys[start : start + 1000])
        except redis.RedisError:
            log.warning("could not remove the chunks of failed snapshot v%d of %s", version, self.instance_id)

    def _batches(self, count: int) -> Iterator[tuple[int, int]]:
        per_round = max(1, ROUND_TRIP_BYTES // self.chunk_bytes)
        for start in range(0, count, per_round):
            yield start, min(per_round, count - start)

    # -- reading ---------------------------------------------------------------------------------------
    def latest_version(self) -> int | None:
        """The version ``latest`` points at (None when no snapshot was committed)."""
        try:
            raw = cast(bytes | None, self._redis.get(self.latest_key))
        except redis.RedisError as exc:
            raise SnapshotError(f"snapshots of {self.instance_id}: Redis failed: {exc}") from exc
        return int(raw) if raw is not None else None

    def list_versions(self) -> list[int]:
        """Committed versions, oldest first."""
        try:
            members = cast(list[bytes], self._redis.zrange(self.versions_key, 0, -1))
        except redis.RedisError as exc:
            raise SnapshotError(f"snapshots of {self.instance_id}: Redis failed: {exc}") from exc
        return sorted(int(m) for m in members)

    def manifest(self, version: int) -> SnapshotManifest:
        try:
            raw = cast(bytes | None, self._redis.get(self.manifest_key(version)))
        except redis.RedisError as exc:
            raise SnapshotError(f"snapshots of {self.instance_id}: Redis failed: {exc}") from exc
        if raw is None:
            raise SnapshotNotFoundError(
                f"snapshot v{version} of {self.instance_id} does not exist (versions: {self.list_versions()})"
            )
        manifest = SnapshotManifest.from_json(raw)
        if manifest.version != version or manifest.instance_id != self.instance_id:
            raise SnapshotCorruptError(
                f"manifest under v{version} of {self.instance_id} describes v{manifest.version} of "
                f"{manifest.instance_id}"
            )
        return manifest

    def load(self, version: int | None = None) -> SnapshotPayload:
        """The snapshot ``version`` (default: ``latest``), every checksum verified.

        Raises :class:`SnapshotNotFoundError` when it does not exist and :class:`SnapshotCorruptError`
        when a chunk is missing or differs, or the content is not a plain dict of tensors.
        """
        if version is None:
            version = self.latest_version()
            if version is None:
                raise SnapshotNotFoundError(f"no snapshot of {self.instance_id} in namespace {self.namespace!r} yet")
        manifest = self.manifest(version)
        tensors = decode_tensors(self._read_verified(manifest))
        if set(tensors) != set(manifest.tensors):
            raise SnapshotCorruptError(
                f"snapshot v{version} of {self.instance_id}: tensors {sorted(tensors)} differ from the "
                f"manifest's {sorted(manifest.tensors)}"
            )
        return SnapshotPayload(
            tensors=tensors,
            plan=manifest.plan,
            offsets=manifest.offsets,
            counters=manifest.counters,
            compensator=manifest.compensator,
            meta=manifest.meta,
            version=version,
        )

    def load_latest_valid(self) -> SnapshotPayload:
        """The newest snapshot that loads and verifies, skipping (and logging) corrupt ones.

        Raises :class:`SnapshotNotFoundError` when none is valid; Redis failures propagate as
        :class:`SnapshotError` rather than being taken for corruption.
        """
        latest = self.latest_version()
        candidates = [v for v in reversed(self.list_versions()) if latest is None or v <= latest]
        problems: list[str] = []
        for version in candidates:
            try:
                return self.load(version)
            except (SnapshotCorruptError, SnapshotNotFoundError) as exc:
                log.warning("skipping snapshot v%d of %s: %s", version, self.instance_id, exc)
                problems.append(f"v{version}: {exc}")
        detail = "; ".join(problems) if problems else "none was saved"
        raise SnapshotNotFoundError(f"no valid snapshot of {self.instance_id}: {detail}")

    def _read_verified(self, manifest: SnapshotManifest) -> bytes:
        parts: list[bytes] = []
        who = f"snapshot v{manifest.version} of {self.instance_id}"
        for start, batch in self._batches(len(manifest.chunks)):
            keys = [self.chunk_key(manifest.version, i) for i in range(start, start + batch)]
            try:
                values = cast(list[bytes | None], self._redis.mget(keys))
            except redis.RedisError as exc:
                raise SnapshotError(f"{who}: Redis failed: {exc}") from exc
            for info, value in zip(manifest.chunks[start : start + batch], values, strict=True):
                if value is None:
                    raise SnapshotCorruptError(f"{who}: chunk {info.index} is missing")
                if len(value) != info.size or sha256_hex(value) != info.sha256:
                    raise SnapshotCorruptError(
                        f"{who}: chunk {info.index} is corrupt (expected {info.size} bytes with sha256 "
                        f"{info.sha256[:12]}…, got {len(value)} bytes with {sha256_hex(value)[:12]}…)"
                    )
                parts.append(value)
        data = b"".join(parts)
        if sha256_hex(data) != manifest.sha256:
            raise SnapshotCorruptError(f"{who}: the total sha256 differs from the manifest's")
        return data

    # -- listing and pruning ---------------------------------------------------------------------------
    def describe(self, version: int, verify: bool = False) -> SnapshotStatus:
        """A version's manifest and validity (with ``verify``: every chunk read and checked)."""
        manifest: SnapshotManifest | None = None
        try:
            manifest = self.manifest(version)
            if verify:
                decode_tensors(self._read_verified(manifest))
        except (SnapshotCorruptError, SnapshotNotFoundError) as exc:
            return SnapshotStatus(version=version, manifest=manifest, valid=False, error=str(exc))
        return SnapshotStatus(version=version, manifest=manifest, valid=True)

    def list_snapshots(self, verify: bool = False) -> list[SnapshotStatus]:
        """Every committed version, newest first."""
        return [self.describe(v, verify=verify) for v in reversed(self.list_versions())]

    def delete(self, version: int) -> None:
        """Remove a version's chunks, manifest and listing (``latest`` is not moved)."""
        try:
            chunk_keys: list[str] = []
            try:
                count = len(self.manifest(version).chunks)
                chunk_keys = [self.chunk_key(version, i) for i in range(count)]
            except (SnapshotCorruptError, SnapshotNotFoundError):
                pattern = f"{self._base}:v{version}:chunk:*"
                chunk_keys = [k.decode() for k in self._redis.scan_iter(match=pattern, count=1000)]
            keys = [*chunk_keys, self.manifest_key(version)]
            for start in range(0, len(keys), 1000):
                self._redis.unlink(*keys[start : start + 1000])
            self._redis.zrem(self.versions_key, str(version))
        except redis.RedisError as exc:
            raise SnapshotError(f"could not delete snapshot v{version} of {self.instance_id}: {exc}") from exc

    def prune(self, keep: int) -> list[int]:
        """Delete all but the ``keep`` newest versions (never the one ``latest`` points at); return the
        deleted versions."""
        if keep < 1:
            raise ConfigError(f"prune keeps at least one snapshot, got keep={keep}")
        latest = self.latest_version()
        versions = self.list_versions()
        doomed = [v for v in versions[: max(0, len(versions) - keep)] if v != latest]
        for version in doomed:
            self.delete(version)
        return doomed
