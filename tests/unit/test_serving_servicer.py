"""``ferret.v1.Serving`` over a model set by the test (no Redis): Predict's answers, its INVALID_ARGUMENT and
UNAVAILABLE replies, health before and after the first model, reflection, the token, the metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.serving.client import PredictCallError, ServingClient, probabilities
from services.serving.holder import ServedModel
from services.serving.model_card import ModelCard, predict_probabilities
from services.serving.server import SERVING_SERVICE_NAME, ServingServer, create_serving_server

CARD = ModelCard("mlp", (1, 8, 8), 10)
TOKEN = "serving-test-token"


def served(version: int = 7, seed: int = 0) -> ServedModel:
    model = CARD.build().as_sequential().eval()  # the card builds with seed 0: perturb for another model
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return ServedModel.of(model, CARD, version, update_ms=1_700_000_000_000)


@pytest.fixture
def server() -> Iterator[ServingServer]:
    s = create_serving_server(None, max_batch=64).start()
    try:
        yield s
    finally:
        s.stop(0)


def health(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


def images(count: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, 1, 8, 8), dtype=np.uint8)


def test_before_the_first_model_predict_is_unavailable_and_health_not_serving(server: ServingServer) -> None:
    assert health(server.target) == health_pb2.HealthCheckResponse.NOT_SERVING
    with ServingClient(server.target) as client, pytest.raises(PredictCallError) as info:
        client.predict(images(1))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert "no model yet" in info.value.details and "trainer.models_interval_s" in info.value.details


def test_predict_answers_the_models_classes_probabilities_and_version(server: ServingServer) -> None:
    model = served(version=7)
    server.holder.set(model)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health(server.target) == health(server.target, SERVING_SERVICE_NAME) == serving
    xs = images(5)
    with ServingClient(server.target) as client:
        reply = client.predict(xs)
    expected = predict_probabilities(model.model, torch.from_numpy(xs).float() / 255)
    np.testing.assert_allclose(probabilities(reply), expected.numpy(), rtol=0, atol=1e-6)
    assert list(reply.classes) == expected.argmax(dim=1).tolist()
    np.testing.assert_allclose(reply.confidences, expected.max(dim=1).values.numpy(), rtol=0, atol=1e-6)
    assert reply.model_version == 7 and reply.model_update_time_ms == 1_700_000_000_000
    assert reply.model_received_time_ms >= reply.model_update_time_ms


def test_float_inputs_are_taken_as_they_are(server: ServingServer) -> None:
    model = served()
    server.holder.set(model)
    xs = np.random.default_rng(2).random((3, 1, 8, 8), dtype=np.float32)
    with ServingClient(server.target) as client:
        reply = client.predict(xs)
    expected = predict_probabilities(model.model, torch.from_numpy(xs)).numpy()
    np.testing.assert_allclose(probabilities(reply), expected, rtol=0, atol=1e-6)


def test_a_newer_model_answers_from_the_next_call(server: ServingServer) -> None:
    server.holder.set(served(version=1, seed=0))
    with ServingClient(server.target) as client:
        first = client.predict(images(4))
        server.holder.set(served(version=2, seed=5))
        second = client.predict(images(4))
    assert (first.model_version, second.model_version) == (1, 2)
    assert not np.array_equal(probabilities(first), probabilities(second))


@pytest.mark.parametrize(
    ("xs", "message"),
    [
        (np.zeros((2, 1, 28, 28), np.uint8), r"shape \[2, 1, 28, 28\]: expected \[B, 1, 8, 8\]"),
        (np.zeros((1, 8, 8), np.uint8), r"shape \[1, 8, 8\]: expected \[B, 1, 8, 8\]"),
        (np.zeros((65, 1, 8, 8), np.uint8), r"1 <= B <= 64"),
        (np.zeros((2, 1, 8, 8), np.int32), r"dtype 'int32': expected one of uint8, float16, float32, float64"),
        (np.full((2, 1, 8, 8), np.nan, np.float32), r"sample 0 of the batch is invalid \(non_finite\)"),
        (np.full((1, 1, 8, 8), 5000.0, np.float32), r"sample 0 of the batch is invalid \(out_of_range\)"),
    ],
)
def test_invalid_inputs_are_invalid_argument_with_a_precise_message(
    server: ServingServer, xs: np.ndarray, message: str
) -> None:
    server.holder.set(served())
    with ServingClient(server.target) as client, pytest.raises(PredictCallError) as info:
        client.predict(xs)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(message, info.value.details), info.value.details


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_invalid(server: ServingServer) -> None:
    server.holder.set(served())
    from services.proto_gen.ferret.v1 import serving_pb2_grpc
    from services.serving.client import predict_request

    request = predict_request(images(2))
    request.inputs.data = request.inputs.data[:-1]
    with grpc.insecure_channel(server.target) as channel, pytest.raises(grpc.RpcError) as info:
        serving_pb2_grpc.ServingStub(channel).Predict(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "127 data bytes, expected 128" in info.value.details()


def test_reflection_lists_the_serving_service(server: ServingServer) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert {SERVING_SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_the_token_is_required_as_on_the_control_plane() -> None:
    s = create_serving_server(None, token=TOKEN).start()
    try:
        s.holder.set(served())
        with ServingClient(s.target) as client, pytest.raises(PredictCallError) as info:
            client.predict(images(1))
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        with ServingClient(s.target, token=TOKEN) as client:
            assert client.predict(images(1)).model_version == 7
    finally:
        s.stop(0)


def test_beyond_loopback_without_a_token_is_refused() -> None:
    from ferret_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"serving\.listen: serving would listen on 0\.0\.0\.0"):
        create_serving_server(None, address="0.0.0.0:0")


def test_metrics_report_version_freshness_and_latency(server: ServingServer) -> None:
    from prometheus_client import generate_latest

    server.holder.set(served(version=9))
    with ServingClient(server.target) as client:
        client.predict(images(3))
    text = generate_latest(server.metrics.registry).decode()
    assert "ferret_serving_model_version 9.0" in text
    assert "ferret_serving_model_updates_total 1.0" in text
    assert "ferret_serving_predictions_total 3.0" in text
    assert "ferret_serving_predict_latency_seconds_count 1.0" in text
    assert "ferret_serving_model_freshness_seconds_count 1.0" in text


def test_the_cli_client_sends_one_predict(
    server: ServingServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli.main import main

    server.holder.set(served(version=4))
    np.save(tmp_path / "batch.npy", images(2))
    assert main(["serve", "--predict", str(tmp_path / "batch.npy"), "--target", server.target]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["model_version"] == 4 and len(printed["classes"]) == len(printed["confidences"]) == 2


def test_the_cli_client_reports_a_refused_predict_in_one_line(
    server: ServingServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli.main import main

    np.save(tmp_path / "batch.npy", images(1))
    assert main(["serve", "--predict", str(tmp_path / "batch.npy"), "--target", server.target]) == 1
    assert "Predict: UNAVAILABLE: no model yet" in capsys.readouterr().err
