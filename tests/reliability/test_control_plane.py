"""Hostile clients of the control plane.

The attack guarded against: with a token set, 40 open unauthenticated reflection streams must not take
every server thread (reflection is not exempt from auth), so authorised calls and health checks still
answer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from ferret_core.errors import ConfigError
from services import failpoints
from services.control.client import ControlCallError, ControlClient
from services.control.server import ControlServer, create_server
from services.proto_gen.ferret.v1 import control_pb2 as pb
from services.proto_gen.ferret.v1 import control_pb2_grpc
from tests.unit.control_fakes import PLANNER, FakeTrainer

TOKEN = "reliability-token"
STREAMS = 40


class HeldStreams:
    """``count`` reflection streams that send no request and stay open until :meth:`close` (each one
    the server accepts blocks a thread reading its first request: the attack this module guards against)."""

    def __init__(self, target: str, count: int, token: str | None = None) -> None:
        self._release = threading.Event()
        self._channel = grpc.insecure_channel(target)
        stub = reflection_pb2_grpc.ServerReflectionStub(self._channel)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.calls = [stub.ServerReflectionInfo(self._requests(), metadata=metadata) for _ in range(count)]

    def _requests(self) -> Iterator[reflection_pb2.ServerReflectionRequest]:
        self._release.wait(60)
        yield from ()

    def outcomes(self, settled: Callable[[list[str]], bool], timeout_s: float = 20.0) -> list[str]:
        """Each stream's end (its status code name) or ``OPEN``, once ``settled`` says they are final."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = [call.code().name if call.done() else "OPEN" for call in self.calls]
            if settled(seen) or time.monotonic() > deadline:
                return seen
            time.sleep(0.02)

    def close(self) -> None:
        self._release.set()
        for call in self.calls:
            call.cancel()
        self._channel.close()


@pytest.fixture
def secured() -> Iterator[ControlServer]:
    server = create_server(
        PLANNER, FakeTrainer(PLANNER.plan(None)), token=TOKEN, health_address="127.0.0.1:0", unary_workers=2
    ).start()
    yield server
    server.stop(grace_s=0.5)


def test_unauthenticated_streams_cannot_starve_the_control_plane(secured: ControlServer) -> None:
    held = HeldStreams(secured.target, STREAMS)
    try:
        assert held.outcomes(lambda seen: "OPEN" not in seen) == ["UNAUTHENTICATED"] * STREAMS
        with ControlClient(secured.target, token=TOKEN, timeout_s=5) as client:
            assert client.get_plan().plan_version == 1
            assert client.health() == "SERVING"
        with ControlClient(f"127.0.0.1:{secured.health_port}", timeout_s=5) as probe:
            assert probe.health() == "SERVING"
    finally:
        held.close()


def test_one_peer_gets_a_bounded_number_of_streams() -> None:
    server = create_server(
        PLANNER, FakeTrainer(PLANNER.plan(None)), max_watchers=16, max_streams_per_peer=4, unary_workers=2
    ).start()
    held = HeldStreams(server.target, STREAMS)
    try:
        outcomes = held.outcomes(lambda seen: seen.count("OPEN") <= 4)
        assert outcomes.count("OPEN") == 4
        assert outcomes.count("RESOURCE_EXHAUSTED") == STREAMS - 4
        assert server.limiter is not None and server.limiter.open_streams == 4
        with ControlClient(server.target, timeout_s=5) as client:  # unary calls always find a thread
            assert client.get_plan().plan_version == 1
            assert client.get_status().items_received == 10
            assert client.health() == "SERVING"
    finally:
        held.close()
        server.stop(grace_s=0.5)


def test_binding_beyond_loopback_needs_a_token_or_insecure(caplog: pytest.LogCaptureFixture) -> None:
    trainer = FakeTrainer(PLANNER.plan(None))
    with pytest.raises(ConfigError, match=r"control\.listen: .*beyond loopback.*control\.insecure: true"):
        create_server(PLANNER, trainer, address="0.0.0.0:0")
    with caplog.at_level(logging.WARNING):
        insecure = create_server(PLANNER, trainer, address="0.0.0.0:0", insecure=True)
    insecure.stop(grace_s=0)
    assert "without authentication" in caplog.text
    create_server(PLANNER, trainer, address="0.0.0.0:0", token=TOKEN).stop(grace_s=0)


def test_infeasible_budget_carries_rich_error_details(secured: ControlServer) -> None:
    minimum = PLANNER.plan(None).min_feasible_bytes
    with grpc.insecure_channel(secured.target) as channel:
        stub = control_pb2_grpc.ControlStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as err:
            stub.SetMemoryBudget(
                pb.SetMemoryBudgetRequest(budget_bytes=1024), metadata=(("authorization", f"Bearer {TOKEN}"),)
            )
    status = rpc_status.from_call(err.value)
    assert status is not None and err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    failure = error_details_pb2.PreconditionFailure()
    assert any(d.Unpack(failure) for d in status.details)
    (violation,) = failure.violations
    assert violation.subject == "budget_bytes" and f"{minimum} bytes" in violation.description
    with ControlClient(secured.target, token=TOKEN) as client, pytest.raises(ControlCallError) as call:
        client.set_memory_budget(1024)
    assert call.value.min_feasible_bytes == minimum


def test_failpoint_mid_replan_leaves_the_plan_in_force(secured: ControlServer) -> None:
    failpoints.configure({failpoints.ENV: "control.mid-replan"})
    try:
        with ControlClient(secured.target, token=TOKEN) as client, pytest.raises(ControlCallError) as err:
            client.set_memory_budget(PLANNER.plan(None).planned_bytes)
    finally:
        failpoints.configure({})
    assert err.value.code == grpc.StatusCode.INTERNAL and "control.mid-replan" in err.value.details
    with ControlClient(secured.target, token=TOKEN) as client:
        assert client.get_plan().plan_version == 1
        assert client.health() == "SERVING"
