"""Record failures that outlive the process, in Redis: the poison-record count of
:mod:`services.trainer.failures`.

One hash per consumer group, ``<ns>:failures:{<group>}`` (a record's identity, topic/partition/offset, is
the group's, whichever replica held it), field ``<topic>/<partition>/<offset>``, value
``{"count": n, "error": "<reason>: <detail>"}``. Written only when the trainer stops on a record (rare),
read once per record only while there are entries (the hash is loaded at start and kept in memory).
Redis unreachable: the count is kept in this process's memory only (logged), so a record may fail again
after a restart until Redis answers.
"""

from __future__ import annotations

import json
import logging
import time

import redis

from services.trainer.failures import MemoryFailureLog

log = logging.getLogger("ferret.trainer")

ERROR_LIMIT = 2000  # characters of the error text kept
RETRY_S = 30.0  # while Redis is down, how often loading is tried again


class RedisFailureLog:
    """A :class:`~services.trainer.failures.FailureLog` in a Redis hash (module docstring)."""

    def __init__(self, client: redis.Redis, namespace: str, group: str) -> None:
        self._redis = client
        self.key = f"{namespace}:failures:{{{group}}}"
        self._memory = MemoryFailureLog()
        self._loaded = False
        self._retry_at = 0.0

    def _load(self) -> None:
        if self._loaded or time.monotonic() < self._retry_at:
            return
        try:
            entries = self._redis.hgetall(self.key)
        except redis.RedisError as exc:
            self._retry_at = time.monotonic() + RETRY_S
            log.warning("record failures: Redis unavailable (%s); counting in memory", exc)
            return
        self._loaded = True
        for field, raw in entries.items():
            try:
                entry = json.loads(raw)
                name = field.decode() if isinstance(field, bytes) else field
                self._memory.put(name, int(entry["count"]), str(entry["error"]))
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                log.warning("record failures: ignoring the malformed entry %r", field[:80])

    def record(self, key: str, error: str) -> int:
        self._load()
        count = self._memory.record(key, error[:ERROR_LIMIT])
        try:
            self._redis.hset(self.key, key, json.dumps({"count": count, "error": error[:ERROR_LIMIT]}))
        except redis.RedisError as exc:
            log.error("record failures: could not save the failure of %s (%s); it counts in memory only", key, exc)
        return count

    def get(self, key: str) -> tuple[int, str] | None:
        self._load()
        return self._memory.get(key)
