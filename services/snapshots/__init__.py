"""Snapshots of a trainer replica in Redis: versioned, chunked, checksummed, optionally signed (DESIGN §4).

The trainer's start-up API: ``redis_client`` (timeouts), ``signing_key`` (the key, or unsigned as an
explicit choice), ``SnapshotStore(..., hmac_key=...)``,
``Reconnect`` (degraded mode with backoff while Redis is down), ``ModelFingerprint`` +
``SnapshotStore.newest_compatible`` (the newest valid snapshot of the configured model, and what was
skipped), ``SnapshotStore.prune`` (keeps the newest K valid ones).
"""

from services.snapshots.codec import SnapshotManifest, SnapshotPayload
from services.snapshots.compat import ModelFingerprint, TensorSpec
from services.snapshots.connect import Backoff, Reconnect, redacted_url, redis_client
from services.snapshots.errors import (
    SnapshotAuthError,
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotUnavailableError,
    SnapshotWriteError,
)
from services.snapshots.signing import signing_key
from services.snapshots.store import PreparedSnapshot, RestoreChoice, SkippedSnapshot, SnapshotStatus, SnapshotStore

__all__ = [
    "Backoff",
    "ModelFingerprint",
    "PreparedSnapshot",
    "Reconnect",
    "RestoreChoice",
    "SkippedSnapshot",
    "SnapshotAuthError",
    "SnapshotCorruptError",
    "SnapshotError",
    "SnapshotManifest",
    "SnapshotNotFoundError",
    "SnapshotPayload",
    "SnapshotStatus",
    "SnapshotStore",
    "SnapshotUnavailableError",
    "SnapshotWriteError",
    "TensorSpec",
    "redacted_url",
    "redis_client",
    "signing_key",
]
