"""The reliability tier: faults, hostile input and hostile clients against real parts. It uses
the integration tier's embedded Tansu broker and Valkey server (one per session), and starts its own
Valkey where a test stops, freezes or restarts it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.localstack.ports import free_port
from services.localstack.redis_server import RedisServer
from tests.integration.conftest import (  # noqa: F401  (fixtures re-exported for this tier)
    bootstrap_servers,
    local_stack,
    redis_client,
    redis_url,
    topic_prefix,
)


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[RedisServer]:
    """A Valkey server of this test alone, on a fixed free port (so it can be stopped and restarted)."""
    server = RedisServer(tmp_path / "valkey", port=free_port("127.0.0.1"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
