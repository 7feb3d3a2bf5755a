"""Errors of the snapshot store; the control plane maps them to gRPC status codes."""

from __future__ import annotations

from ferret_core.errors import FerretError


class SnapshotError(FerretError, RuntimeError):
    """The snapshot store failed (e.g. Redis unreachable)."""


class SnapshotNotFoundError(SnapshotError, LookupError):
    """The snapshot (or any snapshot) does not exist: gRPC NOT_FOUND."""


class SnapshotCorruptError(SnapshotError, ValueError):
    """A snapshot exists but a chunk is missing, a checksum differs, or its content is not plain data."""


class SnapshotWriteError(SnapshotError):
    """Saving a snapshot failed; ``latest`` still points at the previous one."""


class SnapshotUnavailableError(SnapshotError, ConnectionError):
    """Redis cannot be reached or did not answer in time (connection refused, socket timeout): the store
    is degraded, not corrupt; retry later (:class:`services.snapshots.connect.Reconnect`)."""


class SnapshotAuthError(SnapshotUnavailableError):
    """Redis answered but refused the credentials (wrong or missing password, unknown or disabled ACL user):
    a misconfiguration, not an outage. At start-up :class:`services.snapshots.connect.Reconnect` raises it
    (the trainer does not start) unless snapshots are optional; after start-up (e.g. a rotated password)
    it degrades the store like an outage, so a running trainer keeps predicting."""
