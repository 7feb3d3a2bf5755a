"""Snapshots of a trainer replica in Redis: versioned, chunked, checksummed, optionally signed (DESIGN §4).

The trainer's start-up API: ``redis_client`` (timeouts), ``SnapshotStore(..., hmac_key=...)``,
``Reconnect`` (degraded mode with backoff while Redis is down), ``ModelFingerprint`` +
``SnapshotStore.newest_compatible`` (the newest valid snapshot of the configured model, and what was
skipped), ``SnapshotStore.prune`` (keeps the newest K valid ones).
"""

from services.snapshots.codec import SnapshotManifest, SnapshotPayload
from services.snapshots.compat import ModelFingerprint, TensorSpec
from services.snapshots.connect import Backoff, Reconnect, redacted_url, redis_client
from services.snapshots.errors import (
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotUnavailableError,
    SnapshotWriteError,
)
from services.snapshots.store import PreparedSnapshot, RestoreChoice, SkippedSnapshot, SnapshotStatus, SnapshotStore

__all__ = [
    "Backoff",
    "ModelFingerprint",
    "PreparedSnapshot",
    "Reconnect",
    "RestoreChoice",
    "SkippedSnapshot",
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
]
