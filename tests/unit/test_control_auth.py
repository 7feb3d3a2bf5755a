"""Token auth (health and reflection exempt) and TLS of the control plane."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ferret_core.errors import ConfigError
from services.control.auth import ServerTls, TokenAuthInterceptor
from services.control.client import ControlCallError, ControlClient
from services.control.server import ControlServer, create_server

from .control_fakes import PLANNER, FakeTrainer

TOKEN = "s3cret-token"


@pytest.fixture
def control() -> Iterator[ControlServer]:
    server = create_server(PLANNER, FakeTrainer(PLANNER.plan(None)), token=TOKEN).start()
    yield server
    server.stop(grace_s=1.0)


@pytest.mark.parametrize("token", [None, "wrong"])
def test_missing_or_wrong_token_is_unauthenticated(control: ControlServer, token: str | None) -> None:
    with ControlClient(control.target, token=token) as client:
        with pytest.raises(ControlCallError) as err:
            client.get_plan()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert ("missing" if token is None else "wrong") in err.value.details
        with pytest.raises(ControlCallError) as err:
            next(client.watch_status(interval_s=0.01))
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


def list_services(target: str, token: str | None) -> set[str]:
    with grpc.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        (response,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5, metadata=metadata))
    return {s.name for s in response.list_services_response.service}


def test_right_token_is_served_health_and_reflection_included(control: ControlServer) -> None:
    with ControlClient(control.target, token=TOKEN) as client:
        assert client.get_plan().plan_version == 1
        assert next(client.watch_status(interval_s=0.01)).items_received == 10
        assert client.health() == "SERVING"
    assert "ferret.v1.Control" in list_services(control.target, TOKEN)


@pytest.mark.parametrize("token", [None, "wrong"])
def test_health_and_reflection_need_the_token_too(control: ControlServer, token: str | None) -> None:
    with ControlClient(control.target, token=token) as anonymous:
        with pytest.raises(ControlCallError) as err:
            anonymous.health()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as rpc:
        list_services(control.target, token)
    assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_health_port_serves_probes_without_the_token() -> None:
    server = create_server(PLANNER, FakeTrainer(PLANNER.plan(None)), token=TOKEN, health_address="127.0.0.1:0").start()
    try:
        assert server.health_port
        with ControlClient(f"127.0.0.1:{server.health_port}") as probe:
            assert probe.health() == "SERVING"
            assert probe.health("ferret.liveness") == "SERVING"
            with pytest.raises(ControlCallError) as err:
                probe.get_plan()  # the health port serves health alone
            assert err.value.code == grpc.StatusCode.UNIMPLEMENTED
        server.health.set_ready(False)
        with ControlClient(f"127.0.0.1:{server.health_port}") as probe:
            assert probe.health() == "NOT_SERVING"
    finally:
        server.stop(grace_s=1.0)


def test_empty_token_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        TokenAuthInterceptor("")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_tls_with_token(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    tls = ServerTls(cert_file=cert, key_file=key)
    control = create_server(PLANNER, FakeTrainer(PLANNER.plan(None)), token=TOKEN, tls=tls).start()
    try:
        with ControlClient(control.target, token=TOKEN, tls_ca=cert) as client:
            assert client.get_plan().plan_version == 1
        with ControlClient(control.target, token=TOKEN) as plaintext:
            with pytest.raises(ControlCallError) as err:
                plaintext.get_plan()
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        control.stop(grace_s=1.0)


def test_unreadable_tls_files_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "k.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="not PEM"):
        ServerTls(cert_file=tmp_path / "k.pem", key_file=tmp_path / "k.pem").credentials()
    with pytest.raises(ConfigError, match="cannot read"):
        ServerTls(cert_file=tmp_path / "k.pem", key_file=tmp_path / "missing.pem").credentials()
