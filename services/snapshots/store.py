"""Versioned, chunked snapshots in Redis (DESIGN §4 "Redis snapshot layout").

Keys of one replica (``{…}`` is a Redis Cluster hash tag, so one replica's keys share a slot)::

    <ns>:snap:{<instance>}:seq                 INCR counter that hands out versions
    <ns>:snap:{<instance>}:v<N>:chunk:<k>      bytes k·chunk_bytes … of torch.save({name: tensor})
    <ns>:snap:{<instance>}:v<N>:manifest       JSON: checksums, plan, offsets, counters, … (codec.py)
    <ns>:snap:{<instance>}:versions            sorted set of committed versions
    <ns>:snap:{<instance>}:latest              the newest committed version

``save`` writes every chunk, then one Lua script writes the manifest, adds the version to the set and
moves ``latest`` forward: a failed or interrupted save never becomes visible, and its chunks are
removed. ``save`` is ``write(prepare(payload))``: ``prepare`` serialises without Redis, so a caller can
prepare on one thread and write on another (the trainer's record path never waits for Redis).

``load`` checks every chunk's size and sha256 and the total before ``torch.load(...,
weights_only=True)``, then that the plan parses, every tensor has the shape and dtype the manifest
lists, and no tensor holds NaN or ±inf (non-finite tensors are never written either).

Bad state never crashes a reader: a garbage ``latest`` or a non-numeric ``versions`` member is logged
and ignored; :meth:`SnapshotStore.newest_compatible` walks the versions newest first and returns the
first that verifies and matches the configured model (:class:`ModelFingerprint`), with every skipped
one and why. :meth:`SnapshotStore.prune` keeps the newest K *valid* versions. With ``hmac_key`` the
manifests are signed and an unsigned or forged one is invalid. Redis errors that mean "unreachable or
too slow" raise :class:`SnapshotUnavailableError` (degraded, retry: ``connect.Reconnect``); credentials
Redis refuses raise its subclass :class:`SnapshotAuthError` (fatal at start-up, see ``connect.Reconnect``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, cast

import redis

from ferret_core.errors import ConfigError
from services.failpoints import failpoint
from services.snapshots.codec import (
    ChunkInfo,
    SnapshotManifest,
    SnapshotPayload,
    decode_tensors,
    encode_tensors,
    non_finite,
    now_ms,
    sha256_hex,
    split,
    tensor_summary,
)
from services.snapshots.compat import ModelFingerprint, TensorSpec, check_plan
from services.snapshots.errors import (
    SnapshotAuthError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotUnavailableError,
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
local current = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
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


@dataclass(frozen=True)
class SkippedSnapshot:
    """A version a restore passed over: ``corrupt`` (fails verification: chunks, plan, signature,
    shapes, non-finite values) or ``incompatible`` (sound, but of another model)."""

    version: int
    kind: Literal["corrupt", "incompatible"]
    reason: str


@dataclass(frozen=True)
class RestoreChoice:
    """What :meth:`SnapshotStore.newest_compatible` found: the payload (None: start fresh) and every
    newer version it skipped, newest first."""

    payload: SnapshotPayload | None
    skipped: tuple[SkippedSnapshot, ...] = ()

    def describe(self) -> str:
        """One line for the log: what is restored and what was skipped."""
        head = f"v{self.payload.version}" if self.payload is not None else "no compatible snapshot"
        if not self.skipped:
            return head
        return f"{head}; skipped " + "; ".join(f"v{s.version} ({s.kind}: {s.reason})" for s in self.skipped)


@dataclass(frozen=True)
class PreparedSnapshot:
    """A payload serialised for :meth:`SnapshotStore.write` (:meth:`SnapshotStore.prepare`): its chunks and
    checksums, and the payload's plain data for the manifest."""

    payload: SnapshotPayload
    chunks: tuple[memoryview, ...]
    infos: tuple[ChunkInfo, ...]
    total_bytes: int
    sha256: str
    tensors: Mapping[str, Mapping[str, Any]]  # name → {"shape": [...], "dtype": "float32"}


class SnapshotStore:
    """Snapshots of one trainer replica (``instance_id``) under ``namespace`` in Redis.

    ``redis_client`` must return bytes (``decode_responses=False``); give it socket timeouts
    (:func:`services.snapshots.connect.redis_client`) so a frozen Redis cannot stall a save forever.
    ``hmac_key``: sign manifests on save and accept only validly signed ones on load. Not safe for two
    writers with the same instance id beyond this guarantee: versions never collide and ``latest`` only
    moves forward.
    """

    def __init__(
        self,
        redis_client: redis.Redis,
        namespace: str,
        instance_id: str,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        hmac_key: bytes | None = None,
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
        if hmac_key is not None and len(hmac_key) < 16:
            raise ConfigError("the snapshot signing key must have at least 16 bytes")
        self._redis = redis_client
        self.namespace = namespace
        self.instance_id = instance_id
        self.chunk_bytes = chunk_bytes
        self._key = hmac_key
        self._base = f"{namespace}:snap:{{{instance_id}}}"
        self._commit = redis_client.register_script(_COMMIT)
        self._verified: set[int] = set()  # versions this process wrote or fully verified (prune's memo)

    def __repr__(self) -> str:  # never the key
        return f"SnapshotStore({self.namespace!r}, {self.instance_id!r}, signed={self._key is not None})"

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

    def _fail(self, what: str, exc: redis.RedisError) -> NoReturn:
        """Raise the store's error for a Redis failure: unreachable / timed out, or anything else."""
        who = f"snapshots of {self.instance_id}"
        if isinstance(exc, redis.AuthenticationError):  # a ConnectionError to redis-py, a misconfiguration here
            raise SnapshotAuthError(
                f"{who}: Redis refused the credentials while {what} ({exc}); expected the password (and user) "
                "the server is configured with in redis.url (redis://[USER]:PASSWORD@host:6379/0, or "
                "FERRET_REDIS_URL from a secret), or set redis.optional: true to start without snapshots"
            ) from exc
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            raise SnapshotUnavailableError(f"{who}: Redis unavailable while {what}: {exc}") from exc
        raise SnapshotError(f"{who}: Redis failed while {what}: {exc}") from exc

    def ping(self) -> None:
        """Raise :class:`SnapshotUnavailableError` unless Redis answers."""
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            self._fail("pinging", exc)

    # -- writing ---------------------------------------------------------------------------------------
    def save(self, payload: SnapshotPayload) -> int:
        """Write ``payload`` as a new version and point ``latest`` at it; return the version.

        Raises :class:`SnapshotWriteError` (``latest`` unchanged) when anything fails, including
        non-finite tensors (never written) and Redis timeouts.
        """
        return self.write(self.prepare(payload)).version

    def prepare(self, payload: SnapshotPayload) -> PreparedSnapshot:
        """The CPU half of :meth:`save`, no Redis: the tensors checked finite and serialised, cut into
        chunks and checksummed. The result owns its bytes, so the tensors may change once it returns
        (the trainer prepares on its loop thread and writes on another). Raises
        :class:`SnapshotWriteError` for non-finite or unserialisable tensors."""
        bad = non_finite(payload.tensors)
        if bad:
            raise SnapshotWriteError(
                f"snapshot of {self.instance_id} refused: {len(bad)} tensors hold NaN or inf "
                f"({', '.join(bad[:3])}); a snapshot never holds non-finite weights"
            )
        try:
            data = encode_tensors(payload.tensors)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise SnapshotWriteError(f"snapshot of {self.instance_id}: cannot serialise the tensors: {exc}") from exc
        chunks = tuple(split(data, self.chunk_bytes))
        infos = tuple(ChunkInfo(index=i, size=len(c), sha256=sha256_hex(c)) for i, c in enumerate(chunks))
        return PreparedSnapshot(
            payload=payload,
            chunks=chunks,
            infos=infos,
            total_bytes=len(data),
            sha256=sha256_hex(data),
            tensors=tensor_summary(payload.tensors),
        )

    def write(self, prepared: PreparedSnapshot) -> SnapshotManifest:
        """The Redis half of :meth:`save`: a new version's chunks, then its manifest and ``latest`` in one
        script; returns the committed manifest. Raises :class:`SnapshotWriteError` (``latest`` unchanged)."""
        payload = prepared.payload
        try:
            version = int(self._redis.incr(self.seq_key))
        except redis.RedisError as exc:
            raise SnapshotWriteError(f"snapshot of {self.instance_id}: Redis refused a version: {exc}") from exc
        manifest = SnapshotManifest(
            version=version,
            instance_id=self.instance_id,
            created_time_ms=now_ms(),
            chunks=prepared.infos,
            total_bytes=prepared.total_bytes,
            sha256=prepared.sha256,
            tensors=prepared.tensors,
            plan=payload.plan,
            offsets=payload.offsets,
            counters=payload.counters,
            compensator=payload.compensator,
            meta=payload.meta,
        )
        try:
            document = manifest.to_json(self._key)
        except (TypeError, ValueError) as exc:
            raise SnapshotWriteError(
                f"snapshot of {self.instance_id}: plan, offsets, counters, compensator and meta must be "
                f"JSON data: {exc}"
            ) from exc
        try:
            self._put_chunks(version, prepared.chunks)
            failpoint("snapshot.mid-write")
            self._commit_version(version, document)
        except BaseException as exc:
            self._discard_chunks(version, len(prepared.chunks))
            if isinstance(exc, Exception):
                raise SnapshotWriteError(
                    f"snapshot v{version} of {self.instance_id} failed and was discarded (latest is unchanged): {exc}"
                ) from exc
            raise
        self._verified.add(version)
        log.info("snapshot v%d of %s: %d bytes in %d chunks", version, self.instance_id, prepared.total_bytes,
                 len(prepared.chunks))  # fmt: skip
        return manifest

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
        """The version ``latest`` points at (None when none was committed, or when the key holds garbage:
        that is logged and the versions set is used instead)."""
        try:
            raw = cast(bytes | None, self._redis.get(self.latest_key))
        except redis.RedisError as exc:
            self._fail("reading latest", exc)
        if raw is None:
            return None
        try:
            version = int(raw)
        except ValueError:
            version = 0
        if version < 1:
            log.warning("snapshots of %s: ignoring the garbage latest pointer %r", self.instance_id, raw[:40])
            return None
        return version

    def list_versions(self) -> list[int]:
        """Committed versions, oldest first (non-numeric members of the set are logged and ignored)."""
        return self._members()[0]

    def _members(self) -> tuple[list[int], list[bytes]]:
        try:
            members = cast(list[bytes], self._redis.zrange(self.versions_key, 0, -1))
        except redis.RedisError as exc:
            self._fail("listing versions", exc)
        versions, garbage = [], []
        for member in members:
            if member.isdigit() and int(member) >= 1:
                versions.append(int(member))
            else:
                garbage.append(member)
        if garbage:
            log.warning(
                "snapshots of %s: ignoring %d non-numeric versions (%r…)",
                self.instance_id,
                len(garbage),
                garbage[0][:40],
            )
        return sorted(versions), garbage

    def manifest(self, version: int) -> SnapshotManifest:
        """The version's manifest (signature checked when a key is configured)."""
        try:
            raw = cast(bytes | None, self._redis.get(self.manifest_key(version)))
        except redis.RedisError as exc:
            self._fail(f"reading manifest v{version}", exc)
        if raw is None:
            raise SnapshotNotFoundError(f"snapshot v{version} of {self.instance_id} does not exist")
        try:
            manifest = SnapshotManifest.from_json(raw, self._key)
        except SnapshotCorruptError as exc:
            raise SnapshotCorruptError(f"snapshot v{version} of {self.instance_id}: {exc}") from None
        if manifest.version != version or manifest.instance_id != self.instance_id:
            raise SnapshotCorruptError(
                f"manifest under v{version} of {self.instance_id} describes v{manifest.version} of "
                f"{manifest.instance_id}"
            )
        return manifest

    def load(self, version: int | None = None) -> SnapshotPayload:
        """The snapshot ``version`` (default: ``latest``), fully verified (module docstring).

        Raises :class:`SnapshotNotFoundError` when it does not exist, :class:`SnapshotCorruptError` when
        it fails verification, :class:`SnapshotUnavailableError` when Redis does not answer.
        """
        if version is None:
            version = self.latest_version()
            if version is None:
                raise SnapshotNotFoundError(f"no snapshot of {self.instance_id} in namespace {self.namespace!r} yet")
        return self._load_verified(self.manifest(version))

    def _load_verified(self, manifest: SnapshotManifest) -> SnapshotPayload:
        who = f"snapshot v{manifest.version} of {self.instance_id}"
        check_plan(manifest.plan, who)
        tensors = decode_tensors(self._read_verified(manifest))
        if set(tensors) != set(manifest.tensors):
            raise SnapshotCorruptError(
                f"{who}: tensors {sorted(tensors)[:5]} differ from the manifest's {sorted(manifest.tensors)[:5]}"
            )
        for name, tensor in tensors.items():
            listed = TensorSpec.from_summary(manifest.tensors[name])
            if TensorSpec.of(tensor) != listed:
                raise SnapshotCorruptError(
                    f"{who}: tensor {name} is {TensorSpec.of(tensor)}, the manifest says {listed}"
                )
        bad = non_finite(tensors)
        if bad:
            raise SnapshotCorruptError(f"{who}: {len(bad)} tensors hold NaN or inf ({', '.join(bad[:3])})")
        self._verified.add(manifest.version)
        return SnapshotPayload(
            tensors=tensors,
            plan=manifest.plan,
            offsets=manifest.offsets,
            counters=manifest.counters,
            compensator=manifest.compensator,
            meta=manifest.meta,
            version=manifest.version,
        )

    def newest_compatible(self, fingerprint: ModelFingerprint | None = None) -> RestoreChoice:
        """The newest version that verifies and (with ``fingerprint``) matches the configured model, and
        every newer one skipped with why (each also logged). Never raises for bad snapshot state; raises
        :class:`SnapshotUnavailableError` when Redis does not answer (start degraded, retry later)."""
        latest = self.latest_version()
        candidates = [v for v in reversed(self.list_versions()) if latest is None or v <= latest]
        skipped: list[SkippedSnapshot] = []
        for version in candidates:
            try:
                manifest = self.manifest(version)
                who = f"snapshot v{version} of {self.instance_id}"
                plan = check_plan(manifest.plan, who)
                reason = None
                if fingerprint is not None:
                    reason = fingerprint.mismatch(plan.model if plan else "(no plan)", manifest.tensors)
                if reason is not None:
                    skipped.append(SkippedSnapshot(version, "incompatible", reason))
                    log.warning("skipping incompatible snapshot v%d of %s: %s", version, self.instance_id, reason)
                    continue
                return RestoreChoice(self._load_verified(manifest), tuple(skipped))
            except (SnapshotCorruptError, SnapshotNotFoundError) as exc:
                log.warning("skipping snapshot v%d of %s: %s", version, self.instance_id, exc)
                skipped.append(SkippedSnapshot(version, "corrupt", str(exc)))
        return RestoreChoice(None, tuple(skipped))

    def load_latest_valid(self, fingerprint: ModelFingerprint | None = None) -> SnapshotPayload:
        """Like :meth:`newest_compatible`, but raises :class:`SnapshotNotFoundError` (naming what was
        skipped) when no version qualifies."""
        choice = self.newest_compatible(fingerprint)
        if choice.payload is None:
            detail = "; ".join(f"v{s.version}: {s.reason}" for s in choice.skipped) or "none was saved"
            raise SnapshotNotFoundError(f"no valid snapshot of {self.instance_id}: {detail}")
        return choice.payload

    def _read_verified(self, manifest: SnapshotManifest) -> bytes:
        parts: list[bytes] = []
        who = f"snapshot v{manifest.version} of {self.instance_id}"
        for start, batch in self._batches(len(manifest.chunks)):
            keys = [self.chunk_key(manifest.version, i) for i in range(start, start + batch)]
            try:
                values = cast(list[bytes | None], self._redis.mget(keys))
            except redis.RedisError as exc:
                self._fail(f"reading {who}", exc)
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
            check_plan(manifest.plan, f"snapshot v{version} of {self.instance_id}")
            if verify:
                self._load_verified(manifest)
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
            self._fail(f"deleting snapshot v{version}", exc)
        self._verified.discard(version)

    def _valid(self, version: int) -> bool:
        if version in self._verified:
            return True
        return self.describe(version, verify=True).valid

    def prune(self, keep: int) -> list[int]:
        """Keep the ``keep`` newest *valid* versions and every invalid one newer than the oldest of them;
        delete everything older (never the version ``latest`` points at) and drop non-numeric members of
        the versions set. Returns the deleted versions. A version is valid when it fully verifies (done
        once per version per process: versions this store wrote or verified are remembered)."""
        if keep < 1:
            raise ConfigError(f"prune keeps at least one snapshot, got keep={keep}")
        latest = self.latest_version()
        versions, garbage = self._members()
        valid = 0
        doomed: list[int] = []
        for version in reversed(versions):
            if valid >= keep:
                if version != latest:
                    doomed.append(version)
            elif self._valid(version):
                valid += 1
        for version in doomed:
            self.delete(version)
        if garbage:
            try:
                self._redis.zrem(self.versions_key, *garbage)
            except redis.RedisError as exc:
                self._fail("dropping non-numeric versions", exc)
        return sorted(doomed)

    def sweep_orphans(self) -> list[int]:
        """Delete the chunks of versions that were never committed (a writer killed mid-write); returns
        those versions. Call it at start-up, before this replica's first save (a save in progress would
        lose its chunks); it SCANs the keyspace, so not per snapshot."""
        try:
            committed = set(self.list_versions())
            orphans: set[int] = set()
            for key in self._redis.scan_iter(match=f"{self._base}:v*:chunk:*", count=1000):
                match = re.search(rb":v([0-9]+):chunk:", key)
                if match is not None and int(match.group(1)) not in committed:
                    orphans.add(int(match.group(1)))
            for version in orphans:
                keys = list(self._redis.scan_iter(match=f"{self._base}:v{version}:chunk:*", count=1000))
                for start in range(0, len(keys), 1000):
                    self._redis.unlink(*keys[start : start + 1000])
        except redis.RedisError as exc:
            self._fail("sweeping orphan chunks", exc)
        if orphans:
            log.info(
                "snapshots of %s: removed the chunks of uncommitted versions %s", self.instance_id, sorted(orphans)
            )
        return sorted(orphans)
