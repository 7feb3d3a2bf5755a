"""The local stack's parts that need no server: ports, binaries, start failures, external addresses."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferret_core.errors import FerretError
from services.kafka import TopicNames
from services.localstack import (
    BinaryNotFoundError,
    LocalStack,
    LocalStackError,
    free_port,
    port_accepts,
)
from services.localstack.ports import split_host_port
from services.localstack.process import ChildProcess, LocalServer
from services.localstack.redis_server import RedisServer


@pytest.fixture
def listener() -> Iterator[int]:
    """A loopback port with a listening socket (accepts, never answers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_free_port_is_bindable_and_closed() -> None:
    port = free_port()
    assert 0 < port < 65536 and not port_accepts("127.0.0.1", port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_port_accepts_a_listener(listener: int) -> None:
    assert port_accepts("127.0.0.1", listener)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("h:1", ("h", 1)), ("h", ("h", 9092)), ("[::1]:9093", ("::1", 9093)), (" 10.0.0.2:65535 ", ("10.0.0.2", 65535))],
)
def test_split_host_port(text: str, expected: tuple[str, int]) -> None:
    assert split_host_port(text, 9092) == expected


@pytest.mark.parametrize("bad", [":9092", "h:0", "h:port", "h:70000"])
def test_split_host_port_refuses(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        split_host_port(bad, 9092)


def test_missing_binaries_raise_our_error(tmp_path: Path) -> None:
    with pytest.raises(BinaryNotFoundError, match="does not exist") as caught:
        RedisServer(tmp_path, binary=tmp_path / "nope").start()
    assert isinstance(caught.value, FerretError) and isinstance(caught.value, FileNotFoundError)
    with pytest.raises(BinaryNotFoundError, match="Tansu binary"):
        LocalStack(tansu_binary=tmp_path / "nope", redis_url="redis://unused", verify_external=False).start()


def test_a_server_that_exits_reports_its_log_tail(tmp_path: Path) -> None:
    fake = script(tmp_path, "exits", "echo 'line one'\necho 'bind: Address already in use' >&2\nexit 3")
    server = RedisServer(tmp_path / "run", binary=fake, start_timeout=5)
    with pytest.raises(LocalStackError, match="exited with status 3") as caught:
        server.start()
    message = str(caught.value)
    assert "Address already in use" in message and "redis.log" in message
    assert message.count("line one") == LocalServer.port_attempts  # retried on fresh ports
    assert server.pid is None and not server.running


def test_a_server_that_never_gets_ready_is_stopped(tmp_path: Path) -> None:
    fake = script(tmp_path, "hangs", "echo 'waiting forever'\nexec sleep 30")
    server = RedisServer(tmp_path / "run", binary=fake, start_timeout=0.3)
    with pytest.raises(LocalStackError, match=r"did not become ready within 0.3 s(.|\n)*waiting forever"):
        server.start()
    assert not server.running


def test_child_process_stop_escalates_to_kill(tmp_path: Path) -> None:
    stubborn = script(tmp_path, "stubborn", "trap '' TERM\necho started\nwhile :; do sleep 0.05; done")
    child = ChildProcess("stubborn", [str(stubborn)], tmp_path / "stubborn.log")
    child.start()
    child.wait_ready(lambda: "started" in (tmp_path / "stubborn.log").read_text(), timeout=5)
    assert child.stop(timeout=0.2) == -9 and not child.running


def test_attaching_to_external_addresses(listener: int) -> None:
    stack = LocalStack(bootstrap_servers=f"127.0.0.1:{listener}", redis_url="redis://h:1/0", verify_external=False)
    with stack:
        assert stack.bootstrap_servers == f"127.0.0.1:{listener}" and stack.redis_url == "redis://h:1/0"
        assert stack.pids() == {} and stack.run_dir is None
        assert "external" in stack.describe()


def test_an_external_server_that_does_not_answer_fails_fast() -> None:
    stack = LocalStack(bootstrap_servers=f"127.0.0.1:{free_port()}", redis_url="redis://h:1/0", connect_timeout=0.2)
    with pytest.raises(LocalStackError, match=r"Kafka at .* did not answer within 0\.2 s"):
        stack.start()


def test_addresses_before_start_and_empty_ones_are_errors() -> None:
    with pytest.raises(LocalStackError, match="not started"):
        _ = LocalStack().bootstrap_servers
    with pytest.raises(LocalStackError, match="empty"):
        LocalStack(bootstrap_servers=" ")


def test_topic_names() -> None:
    names = TopicNames("demo")
    assert names.all() == ("demo.samples", "demo.predictions", "demo.samples.dlq", "demo.labels")
    assert TopicNames().samples == "ferret.samples"
    with pytest.raises(ValueError, match="invalid topic prefix"):
        TopicNames("a/b")
