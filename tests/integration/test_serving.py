"""The model stream, ``ferret serve`` and ``ferret export`` against the real local broker and Redis: the
stream's chunked updates and trimming on Valkey; a ``ferret run`` trainer publishing its model, ``ferret
serve`` following it and answering Predict with the trainer's own predictions and model version; and an
export of the trainer's snapshot, loaded in a fresh process, predicting exactly as the trainer did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import torch

from services.control.client import ControlCallError, ControlClient
from services.kafka.admin import TopicNames, ensure_topics
from services.localstack.ports import free_port
from services.serving.client import PredictCallError, ServingClient
from services.serving.export_files import encode_weights
from services.serving.model_card import ModelCard
from services.serving.model_stream import ModelStreamReader, ModelStreamWriter

from .trainer_support import SNAPSHOT_KEY, produce_digits, read_predictions, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FERRET = [sys.executable, "-m", "services.cli.main"]
ROOT = Path(__file__).resolve().parents[2]
CARD = ModelCard("mlp", (1, 8, 8), 10)


def test_the_stream_keeps_whole_updates_and_a_late_reader_starts_at_the_newest(redis_client: redis.Redis) -> None:
    writer = ModelStreamWriter(redis_client, "t:models:{r0}", chunk_bytes=1000, keep=2)
    payloads = {v: encode_weights({"0.weight": torch.full((25, 25), float(v))}) for v in range(1, 5)}
    for version, data in payloads.items():
        writer.publish(version, 1000 + version, CARD, data)
    chunks = -(-len(payloads[1]) // 1000)
    assert chunks >= 3 and redis_client.xlen(writer.key) == 2 * chunks  # the newest two updates, whole
    reader = ModelStreamReader(redis_client, writer.key)
    newest = reader.newest()
    assert newest is not None and (newest.version, newest.update_ms, newest.data) == (4, 1004, payloads[4])
    assert reader.follow(newest.entry_id, block_ms=50) == []
    writer.publish(5, 1005, CARD, payloads[1])
    assert [u.version for u in reader.follow(newest.entry_id, block_ms=1000)] == [5]


@pytest.fixture
def env(bootstrap_servers: str, redis_url: str, topic_prefix: str) -> Iterator[dict[str, str]]:
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=1)
    yield {
        **os.environ,
        "FERRET_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "FERRET_KAFKA_TOPIC_PREFIX": topic_prefix,
        "FERRET_KAFKA_GROUP_ID": f"g-{topic_prefix}",
        "FERRET_KAFKA_INSTANCE_ID": "replica-0",
        "FERRET_KAFKA_SAMPLE_PARTITIONS": "1",
        "FERRET_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "FERRET_REDIS_URL": redis_url,
        "FERRET_REDIS_NAMESPACE": topic_prefix,
        "FERRET_REDIS_SNAPSHOT_INTERVAL_S": "0",
        "FERRET_REDIS_HMAC_KEY": SNAPSHOT_KEY,
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": "mlp",
        "FERRET_TRAINER_EXECUTORS": "threads",
        "FERRET_TRAINER_MODELS_INTERVAL_S": "0.2",
        "FERRET_CONTROL_LISTEN": f"127.0.0.1:{free_port()}",
        "FERRET_SERVING_LISTEN": f"127.0.0.1:{free_port()}",
        "FERRET_METRICS_PORT": "0",
    }


def start(env: dict[str, str], log: Path, *command: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as handle:
        return subprocess.Popen([*FERRET, *command, "--log-level", "WARNING"], env=env, cwd=ROOT, stdout=handle,
                                stderr=subprocess.STDOUT)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    return proc.wait(60)


def digits(start_at: int, count: int) -> np.ndarray:
    """The uint8 images ``produce_digits`` sends for sequences start_at … start_at + count − 1."""
    from ferret_core.data import load_dataset

    ds = load_dataset("digits", None)
    rows = [(ds.x_train[s % len(ds.x_train)] * 255).astype(np.uint8) for s in range(start_at, start_at + count)]
    return np.stack(rows)


def settled_version(client: ControlClient, timeout: float = 60.0) -> int:
    """The trainer's model version once it stops changing (every dispatched item trained)."""
    deadline = time.monotonic() + timeout
    last = -1
    while time.monotonic() < deadline:
        version = client.get_status().model_version
        if version == last:
            return version
        last = version
        time.sleep(1.0)
    raise AssertionError("the trainer's model version kept changing")


@pytest.mark.parametrize("executors", ["threads", "processes"])
def test_serve_follows_the_trainer_and_export_round_trips(env: dict[str, str], tmp_path: Path, executors: str) -> None:
    env = {**env, "FERRET_TRAINER_EXECUTORS": executors}  # the master copied from threads' or shared memory
    topics = TopicNames(env["FERRET_KAFKA_TOPIC_PREFIX"])
    bootstrap, serving = env["FERRET_KAFKA_BOOTSTRAP_SERVERS"], env["FERRET_SERVING_LISTEN"]
    server = start(env, tmp_path / "serve.log", "serve")  # before the trainer: it waits for the first model
    trainer = start(env, tmp_path / "trainer.log", "run")
    client = ControlClient(env["FERRET_CONTROL_LISTEN"])
    try:
        wait_serving(trainer, env["FERRET_CONTROL_LISTEN"], tmp_path / "trainer.log")
        produce_digits(bootstrap, topics.samples, 300)
        deadline = time.monotonic() + 90
        while client.get_status().predictions_published < 300:
            assert time.monotonic() < deadline, (tmp_path / "trainer.log").read_text()[-3000:]
            time.sleep(0.2)
        version = settled_version(client)
        assert version > 0
        produce_digits(bootstrap, topics.samples, 50, start=300, labels=False)  # predicted, never trained
        predictions = [p for p in read_predictions(bootstrap, topics.predictions, 350) if p.sequence >= 300]
        assert len(predictions) == 50 and {p.model_version for p in predictions} == {version}
        lineage = client.get_status().model_lineage
        assert lineage > 0 and {p.model_lineage for p in predictions} == {lineage}
        predictions.sort(key=lambda p: p.sequence)
        xs = digits(300, 50)

        # 1. ferret serve answers with the trainer's model: same version, classes and confidences
        wait_serving(server, serving, tmp_path / "serve.log")
        with ServingClient(serving) as serve_client:
            deadline = time.monotonic() + 30
            while (reply := serve_client.predict(xs)).model_version != version:
                assert time.monotonic() < deadline, f"serving stayed at v{reply.model_version}, trainer at v{version}"
                time.sleep(0.2)
            with pytest.raises(PredictCallError, match="INVALID_ARGUMENT"):
                serve_client.predict(np.zeros((1, 1, 28, 28), np.uint8))
        assert list(reply.classes) == [p.predicted_class for p in predictions]
        np.testing.assert_allclose(reply.confidences, [p.confidence for p in predictions], rtol=0, atol=1e-6)
        assert reply.model_update_time_ms <= reply.model_received_time_ms
        assert reply.model_lineage == lineage  # (lineage, version): the very weights the trainer predicted with

        # 2. ferret export of a snapshot, loaded in a fresh process: the trainer's predictions again
        snapshot = subprocess.run(
            [*FERRET, "control", "--target", env["FERRET_CONTROL_LISTEN"], "snapshot"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert snapshot.returncode == 0, snapshot.stderr
    finally:
        client.close()
        assert stop(trainer) == 0
        assert stop(server) == 0
    out = tmp_path / "export"
    exported = subprocess.run([*FERRET, "export", "--out", str(out)], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["model_version"] == version
    assert json.loads((out / "manifest.json").read_text())["model_lineage"] == lineage
    np.save(tmp_path / "inputs.npy", xs)
    script = (
        "import json, sys, numpy as np, torch\n"
        "from services.serving.export_files import load_export\n"
        "from services.serving.model_card import predict_probabilities\n"
        "loaded = load_export(sys.argv[1])\n"
        "xs = torch.from_numpy(np.load(sys.argv[2])).float() / 255\n"
        "p = predict_probabilities(loaded.model, xs)\n"
        "print(json.dumps({'version': loaded.manifest.model_version, 'classes': p.argmax(1).tolist(),\n"
        "                  'confidences': p.max(1).values.tolist(), 'modules': sorted(sys.modules)}))\n"
    )
    fresh = subprocess.run([sys.executable, "-c", script, str(out), str(tmp_path / "inputs.npy")], cwd=ROOT,
                           env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                           timeout=120, check=False)  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    result = json.loads(fresh.stdout)
    assert result["version"] == version
    assert result["classes"] == [p.predicted_class for p in predictions]
    np.testing.assert_allclose(result["confidences"], [p.confidence for p in predictions], rtol=0, atol=1e-6)
    assert not {"redis", "confluent_kafka", "grpc"} & set(result["modules"])  # nothing of the services' clients


def log_tail(tmp_path: Path) -> str:
    return (tmp_path / "trainer.log").read_text()[-3000:]


def test_export_from_a_running_trainer_as_a_torch_export_program(env: dict[str, str], tmp_path: Path) -> None:
    """``ferret export --from-trainer`` with the control plane's token: the trainer takes a snapshot, exactly
    that version is exported, and its ``model.pt2``, loaded in a fresh process by ``torch.export.load``
    alone, predicts as the trainer did (classes exact, confidences within 1e-5)."""
    token = "export-test-token"
    env = {**env, "FERRET_CONTROL_TOKEN": token}
    topics = TopicNames(env["FERRET_KAFKA_TOPIC_PREFIX"])
    bootstrap, control = env["FERRET_KAFKA_BOOTSTRAP_SERVERS"], env["FERRET_CONTROL_LISTEN"]
    trainer = start(env, tmp_path / "trainer.log", "run")
    client = ControlClient(control, token=token)
    without_token = {k: v for k, v in env.items() if k != "FERRET_CONTROL_TOKEN"}
    out = tmp_path / "export"
    command = [*FERRET, "export", "--from-trainer", control, "--torch-export", "--out", str(out)]
    try:
        deadline = time.monotonic() + 90
        while True:
            assert trainer.poll() is None and time.monotonic() < deadline, log_tail(tmp_path)
            try:
                if client.health() == "SERVING":
                    break
            except ControlCallError:
                pass
            time.sleep(0.2)
        produce_digits(bootstrap, topics.samples, 300)
        while client.get_status().predictions_published < 300:
            assert time.monotonic() < deadline, log_tail(tmp_path)
            time.sleep(0.2)
        version = settled_version(client)
        produce_digits(bootstrap, topics.samples, 50, start=300, labels=False)  # predicted, never trained
        predictions = sorted(
            (p for p in read_predictions(bootstrap, topics.predictions, 350) if p.sequence >= 300),
            key=lambda p: p.sequence,
        )
        assert len(predictions) == 50 and {p.model_version for p in predictions} == {version}

        refused = subprocess.run(command, env=without_token, cwd=ROOT, capture_output=True, text=True, timeout=120,
                                 check=False)  # fmt: skip
        assert refused.returncode == 1 and "took no snapshot: UNAUTHENTICATED" in refused.stderr, refused.stderr
        before = client.get_status().last_snapshot_version
        exported = subprocess.run([*command, "--token", token], env=without_token, cwd=ROOT, capture_output=True,
                                  text=True, timeout=180, check=False)  # fmt: skip
        assert exported.returncode == 0, exported.stderr
        reply = json.loads(exported.stdout)
        assert reply["snapshot_version"] == client.get_status().last_snapshot_version > before  # the one it took
    finally:
        client.close()
        assert stop(trainer) == 0
    assert reply["model_version"] == version
    assert reply["files"] == ["model.safetensors", "model.pt2", "manifest.json"]
    torch.save(torch.from_numpy(digits(300, 50)).float() / 255, tmp_path / "xs.pt")  # as the trainer decodes
    script = (
        "import json, sys, torch\n"
        "program = torch.export.load(sys.argv[1]).module()\n"
        "with torch.no_grad():\n"
        "    p = torch.softmax(program(torch.load(sys.argv[2])), dim=1)\n"
        "print(json.dumps({'classes': p.argmax(1).tolist(), 'confidences': p.max(1).values.tolist(),\n"
        "                  'ours': [m for m in sys.modules if m.split('.')[0] in ('services', 'ferret_core')]}))\n"
    )
    fresh = subprocess.run([sys.executable, "-c", script, str(out / "model.pt2"), str(tmp_path / "xs.pt")],
                           cwd=tmp_path, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=120,
                           check=False)  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    result = json.loads(fresh.stdout)
    assert result["ours"] == []
    assert result["classes"] == [p.predicted_class for p in predictions]
    np.testing.assert_allclose(result["confidences"], [p.confidence for p in predictions], rtol=0, atol=1e-5)
