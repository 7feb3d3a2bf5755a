"""Snapshots of a trainer replica in Redis: versioned, chunked, checksummed (DESIGN §4)."""

from services.snapshots.codec import SnapshotManifest, SnapshotPayload
from services.snapshots.errors import (
    SnapshotCorruptError,
    SnapshotError,
    SnapshotNotFoundError,
    SnapshotWriteError,
)
from services.snapshots.store import SnapshotStatus, SnapshotStore

__all__ = [
    "SnapshotCorruptError",
    "SnapshotError",
    "SnapshotManifest",
    "SnapshotNotFoundError",
    "SnapshotPayload",
    "SnapshotStatus",
    "SnapshotStore",
    "SnapshotWriteError",
]
