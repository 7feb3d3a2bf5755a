"""The reliability tier: faults, hostile input and hostile clients against real parts. It uses
the integration tier's embedded Tansu broker and Valkey server (one per session), and starts its own
Valkey where a test stops, freezes or restarts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.localstack.ports import free_port
from services.localstack.redis_server import RedisServer
from tests.integration.conftest import (  # noqa: F401  (fixtures re-exported for this tier)
    bootstrap_servers,
    local_stack,
    redis_client,
    redis_url,
    topic_prefix,
)

REDIS_PASSWORD = "the-right-password-4711"


class PasswordValkey(RedisServer):
    """A Valkey server that requires :data:`REDIS_PASSWORD` (``--requirepass``)."""

    def argv(self, binary: Path, port: int) -> list[str]:
        return [*super().argv(binary, port), "--requirepass", REDIS_PASSWORD]

    def is_ready(self, port: int) -> bool:
        client = redis.Redis(
            host=self.host,
            port=port,
            password=REDIS_PASSWORD,
            socket_connect_timeout=0.2,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def url_with(self, password: str | None) -> str:
        """This server's URL with ``password`` (None: none)."""
        auth = "" if password is None else f":{password}@"
        return f"redis://{auth}{self.host}:{self._started_port()}/0"


@pytest.fixture
def password_valkey(tmp_path: Path) -> Iterator[PasswordValkey]:
    """A Valkey server of this test alone that requires a password (``PasswordValkey.url_with``)."""
    server = PasswordValkey(tmp_path / "valkey-auth")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[RedisServer]:
    """A Valkey server of this test alone, on a fixed free port (so it can be stopped and restarted)."""
    server = RedisServer(tmp_path / "valkey", port=free_port("127.0.0.1"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
