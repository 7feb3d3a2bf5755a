"""The embedded stack starts real servers, stops them without leaving processes, and cleans up after a
failed start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient

from services.localstack import LocalStack, LocalStackError, port_accepts

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    """Whether a process with this id exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_stack_starts_answers_and_stops_cleanly(tmp_path: Path) -> None:
    with LocalStack(run_dir=tmp_path) as stack:
        pids = stack.pids()
        assert set(pids) == {"kafka", "redis"} and all(_alive(p) for p in pids.values())
        metadata = AdminClient({"bootstrap.servers": stack.bootstrap_servers}).list_topics(timeout=10)
        assert metadata.brokers, "the broker answered no metadata"
        client = redis.Redis.from_url(stack.redis_url)
        assert client.ping() and client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        client.close()
        host, port = stack.bootstrap_servers.split(":")
    assert not any(_alive(p) for p in pids.values())
    assert not port_accepts(host, int(port))
    assert (tmp_path / "tansu.log").read_text().strip() and (tmp_path / "redis.log").exists()


def test_temporary_run_dir_is_removed(local_stack: LocalStack) -> None:
    stack = LocalStack(redis_url=local_stack.redis_url)  # only the broker is embedded
    with stack:
        run_dir = stack.run_dir
        assert run_dir is not None and (run_dir / "tansu.log").exists()
        assert set(stack.pids()) == {"kafka"} and stack.redis_url == local_stack.redis_url
    assert not run_dir.exists()


def test_attaching_to_external_servers_starts_nothing(local_stack: LocalStack) -> None:
    with LocalStack(bootstrap_servers=local_stack.bootstrap_servers, redis_url=local_stack.redis_url) as stack:
        assert stack.pids() == {} and stack.run_dir is None
        assert (stack.bootstrap_servers, stack.redis_url) == (local_stack.bootstrap_servers, local_stack.redis_url)
        assert not stack.embedded_kafka and not stack.embedded_redis


def test_a_failed_redis_start_stops_the_broker_too(tmp_path: Path) -> None:
    fake = tmp_path / "fake-redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL: simulated start failure'\nexit 7\n")
    fake.chmod(0o755)
    before = _child_tansu_pids()  # the session's broker is one
    stack = LocalStack(run_dir=tmp_path / "run", redis_binary=fake)
    with pytest.raises(LocalStackError, match="exited with status 7") as caught:
        stack.start()
    assert "simulated start failure" in str(caught.value)  # the log's tail is in the message
    assert stack.broker is None and stack.pids() == {}
    assert _child_tansu_pids() == before


def _child_tansu_pids() -> set[int]:
    """Live tansu processes whose parent is this test process."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if not stat:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        if name.startswith("tansu") and fields[0] != "Z" and int(fields[1]) == os.getpid():
            found.add(int(entry))
    return found
