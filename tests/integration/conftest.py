"""Real servers for the integration tier (STYLE 13): one embedded Tansu broker and one Valkey server per
session from services.localstack, and Apache Kafka / Redis containers from testcontainers when a Docker
engine answers (asked once; without one those tests skip with the reason)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.localstack import LocalStack

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"
REDIS_IMAGE = "redis:7.4"


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Tansu and Valkey as child processes on free loopback ports (logs under the session's tmp dir)."""
    run_dir: Path = tmp_path_factory.mktemp("localstack")
    with LocalStack(run_dir=run_dir) as stack:
        yield stack


@pytest.fixture(scope="session")
def bootstrap_servers(local_stack: LocalStack) -> str:
    return local_stack.bootstrap_servers


@pytest.fixture(scope="session")
def redis_url(local_stack: LocalStack) -> str:
    return local_stack.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A bytes client on the embedded server, emptied after the test."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


@pytest.fixture
def topic_prefix() -> str:
    """A prefix no other test uses (the broker lives for the whole session)."""
    return f"t{uuid.uuid4().hex[:10]}"


@functools.cache
def docker_unavailable_reason() -> str | None:
    """None when a Docker engine answers a ping, else why not (asked once per session)."""
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        return "the docker Python package is not installed (pip install testcontainers)"
    try:
        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"no Docker engine answers ({type(exc).__name__}: {exc}); these tests need one"
    return None


@pytest.fixture(scope="session")
def docker_engine() -> None:
    reason = docker_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def kafka_container(docker_engine: None) -> Iterator[str]:
    """Bootstrap servers of an Apache Kafka container (for what Tansu lacks: transactions, watermarks)."""
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer(KAFKA_IMAGE) as kafka:
        yield kafka.get_bootstrap_server()


@pytest.fixture(scope="session")
def redis_container(docker_engine: None) -> Iterator[str]:
    """URL of a Redis container."""
    from testcontainers.community.redis import RedisContainer

    with RedisContainer(REDIS_IMAGE) as container:
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        yield f"redis://{host}:{port}/0"


@pytest.fixture(params=["tansu", "kafka-container"])
def any_kafka(request: pytest.FixtureRequest) -> str:
    """Bootstrap servers of the embedded broker, then of a Kafka container (skipped without Docker)."""
    name = "bootstrap_servers" if request.param == "tansu" else "kafka_container"
    return str(request.getfixturevalue(name))


@pytest.fixture(params=["valkey", "redis-container"])
def any_redis(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A bytes client on the embedded server, then on a Redis container (skipped without Docker)."""
    name = "redis_url" if request.param == "valkey" else "redis_container"
    client = redis.Redis.from_url(str(request.getfixturevalue(name)))
    try:
        yield client
    finally:
        client.flushdb()
        client.close()
