"""The Kafka broker and Redis that the services need, in one context manager.

Embedded by default (Tansu and Valkey as child processes on free loopback ports, logging into a run
folder); attached to external ones when their addresses are given (then nothing is started, only
checked to answer).

    with LocalStack() as stack:
        stack.bootstrap_servers  # "127.0.0.1:40123"
        stack.redis_url          # "redis://127.0.0.1:40124/0"
        stack.snapshot_key       # a random key for the trainers' snapshots (FERRET_REDIS_HMAC_KEY)
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.localstack.broker import TansuBroker
from services.localstack.ports import LOOPBACK, port_accepts, split_host_port
from services.localstack.process import LocalServer, LocalStackError
from services.localstack.redis_server import RedisServer

KAFKA_DEFAULT_PORT = 9092


def kafka_reachable(bootstrap_servers: str, timeout: float = 0.5) -> bool:
    """Whether any of the comma-separated ``host:port`` servers accepts a TCP connection."""
    for entry in bootstrap_servers.split(","):
        address = entry.strip().split("://")[-1]  # tolerate "PLAINTEXT://host:port"
        if address and port_accepts(*split_host_port(address, KAFKA_DEFAULT_PORT), timeout=timeout):
            return True
    return False


def redis_reachable(url: str, timeout: float = 0.5) -> bool:
    """Whether the Redis at ``url`` answers PING."""
    client = redis.Redis.from_url(
        url, socket_connect_timeout=timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class LocalStack:
    """A Kafka broker and a Redis server for the services: embedded or external.

    ``bootstrap_servers`` / ``redis_url`` given: attach to those (checked to answer within
    ``connect_timeout`` unless ``verify_external`` is false). Missing: start the embedded server.
    ``run_dir`` holds the embedded servers' logs; without one a temporary folder is made and removed on
    :meth:`stop` unless ``keep_run_dir``. The embedded servers die with this process, even when it is
    SIGKILLed, unless ``die_with_parent`` is false (then :meth:`release` can leave them running).
    ``snapshot_key``: a random signing key per stack for the trainers run on it (snapshots are signed by
    default, services/snapshots/signing.py); never logged nor written by the stack.
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | None = None,
        redis_url: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool = False,
        host: str = LOOPBACK,
        start_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        verify_external: bool = True,
        tansu_binary: str | os.PathLike[str] | None = None,
        redis_binary: str | os.PathLike[str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        if bootstrap_servers is not None and not bootstrap_servers.strip():
            raise LocalStackError("bootstrap_servers is empty: give host:port[,host:port] or None to embed")
        if redis_url is not None and not redis_url.strip():
            raise LocalStackError("redis_url is empty: give redis://host:port/db or None to embed")
        self._external_kafka = bootstrap_servers
        self._external_redis = redis_url
        self._requested_run_dir = Path(run_dir) if run_dir is not None else None
        self._keep_run_dir = keep_run_dir
        self._host = host
        self._start_timeout = start_timeout
        self._connect_timeout = connect_timeout
        self._verify_external = verify_external
        self._tansu_binary = tansu_binary
        self._redis_binary = redis_binary
        self._die_with_parent = die_with_parent
        self._run_dir: Path | None = None
        self._owns_run_dir = False
        self.broker: TansuBroker | None = None
        self.redis_server: RedisServer | None = None
        self._started = False
        self.snapshot_key = secrets.token_hex(32)

    # -- addresses -------------------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        if self._external_kafka is not None:
            return self._external_kafka
        if self.broker is None:
            raise LocalStackError("the local stack is not started: call start() or use it in a with block")
        return self.broker.bootstrap_servers

    @property
    def redis_url(self) -> str:
        if self._external_redis is not None:
            return self._external_redis
        if self.redis_server is None:
            raise LocalStackError("the local stack is not started: call start() or use it in a with block")
        return self.redis_server.url

    @property
    def run_dir(self) -> Path | None:
        return self._run_dir

    @property
    def embedded_kafka(self) -> bool:
        return self._external_kafka is None

    @property
    def embedded_redis(self) -> bool:
        return self._external_redis is None

    def pids(self) -> dict[str, int]:
        """Process ids of the embedded servers that run."""
        servers: dict[str, LocalServer | None] = {"kafka": self.broker, "redis": self.redis_server}
        return {name: s.pid for name, s in servers.items() if s is not None and s.pid is not None}

    def describe(self) -> str:
        kafka = "embedded Tansu" if self.embedded_kafka else "external"
        store = "embedded" if self.embedded_redis else "external"
        return f"Kafka {self.bootstrap_servers} ({kafka}); Redis {self.redis_url} ({store})"

    # -- life cycle ------------------------------------------------------------------------------------
    def start(self) -> Self:
        if self._started:
            return self
        try:
            if self.embedded_kafka or self.embedded_redis:
                self._make_run_dir()
            if self._external_kafka is None:
                assert self._run_dir is not None
                self.broker = TansuBroker(
                    self._run_dir,
                    host=self._host,
                    binary=self._tansu_binary,
                    start_timeout=self._start_timeout,
                    die_with_parent=self._die_with_parent,
                ).start()
            elif self._verify_external:
                self._wait_for(lambda: kafka_reachable(self._external_kafka or ""), f"Kafka at {self._external_kafka}")
            if self._external_redis is None:
                assert self._run_dir is not None
                self.redis_server = RedisServer(
                    self._run_dir,
                    host=self._host,
                    binary=self._redis_binary,
                    start_timeout=self._start_timeout,
                    die_with_parent=self._die_with_parent,
                ).start()
            elif self._verify_external:
                self._wait_for(lambda: redis_reachable(self._external_redis or ""), f"Redis at {self._external_redis}")
        except BaseException:
            self.stop()
            raise
        self._started = True
        return self

    def release(self) -> None:
        """Leave the embedded servers running after this process exits (``die_with_parent=False`` only);
        they are then the caller's to stop (their pids: :meth:`pids`)."""
        for server in (self.broker, self.redis_server):
            if server is not None:
                server.release()
        self.redis_server = None
        self.broker = None
        self._started = False

    def stop(self) -> None:
        """Stop what this stack started (Redis, then the broker) and remove its temporary run folder."""
        for server in (self.redis_server, self.broker):
            if server is not None:
                server.stop()
        self.redis_server = None
        self.broker = None
        if self._run_dir is not None and self._owns_run_dir and not self._keep_run_dir:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        self._started = False

    def _make_run_dir(self) -> None:
        if self._requested_run_dir is not None:
            self._requested_run_dir.mkdir(parents=True, exist_ok=True)
            self._run_dir, self._owns_run_dir = self._requested_run_dir, False
        else:
            self._run_dir, self._owns_run_dir = Path(tempfile.mkdtemp(prefix="ferret-stack-")), True

    def _wait_for(self, answers: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self._connect_timeout
        while not answers():
            if time.monotonic() >= deadline:
                raise LocalStackError(
                    f"{what} did not answer within {self._connect_timeout:g} s: start it, fix the address, "
                    "or leave the address unset to use the embedded server"
                )
            time.sleep(0.1)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
