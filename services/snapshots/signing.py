"""The snapshot signing key a trainer starts with: a key, or unsigned snapshots as an explicit choice.

A snapshot's manifest names the Kafka offsets the trainer resumes from. Unsigned, anyone who can write to
Redis can move them (skipping or replaying items) and the trainer restores them without a word. So a
trainer signs its snapshots and verifies them on restore (HMAC-SHA256, :mod:`services.snapshots.codec`)
with ``redis.hmac_key``; without one it refuses to start, unless ``redis.allow_unsigned: true`` says
unsigned snapshots are wanted (then a warning at every start). With a key, unsigned and forged manifests
are skipped on restore whatever ``allow_unsigned`` says.

The deployments carry a key: the demo's local stack generates one per stack (``LocalStack.snapshot_key``),
the compose stack one per volume (docker-compose.yml), Kubernetes reads the ``ferret-snapshots`` Secret
(k8s/base/trainer-statefulset.yaml).
"""

from __future__ import annotations

import logging

from services.config import RedisSettings, SettingsError

log = logging.getLogger(__name__)

KEY_FIX = (
    "set FERRET_REDIS_HMAC_KEY (or redis.hmac_key) to a random string of at least 16 bytes, the same for every "
    "start of this replica (e.g. `openssl rand -hex 32`, kept in a secret), or set redis.allow_unsigned: true "
    "to accept unsigned snapshots (anyone who can write to Redis can then forge their offsets)"
)


def signing_key(redis: RedisSettings) -> bytes | None:
    """``redis.hmac_key`` as bytes; None with ``redis.allow_unsigned`` and no key (a warning is logged).
    Raises :class:`~services.config.SettingsError` (a ``ConfigError``) naming both fixes when neither is set."""
    if redis.hmac_key is not None:
        if redis.allow_unsigned:
            log.warning("redis.allow_unsigned is ignored: redis.hmac_key is set, so unsigned snapshots are refused")
        return redis.hmac_key.encode("utf-8")
    if not redis.allow_unsigned:
        raise SettingsError(
            "redis.hmac_key",
            "a key to sign snapshots with (they are signed unless redis.allow_unsigned is true)",
            None,
            KEY_FIX,
        )
    log.warning(
        "snapshots are unsigned (redis.allow_unsigned: true): anyone who can write to Redis can change the "
        "offsets a restore resumes from; set redis.hmac_key (FERRET_REDIS_HMAC_KEY) to sign them"
    )
    return None
