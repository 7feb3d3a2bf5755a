"""Your own model end to end, as docs/your-model.md tells a user: ``ferret profile`` → ``ferret plan``
from the profile alone → ``ferret simulate`` → ``ferret run`` on the real local stack (Tansu + Valkey),
fed by ``ferret produce``, with a weights file, every command a separate process run from the
repository root (where ``examples.custom_cnn`` is importable)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.control.client import ControlClient
from services.kafka.admin import TopicNames, ensure_topics
from services.localstack.ports import free_port

from .test_trainer_process import TrainerProcess, wait_status
from .trainer_support import SNAPSHOT_KEY, read_predictions

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FERRET = [sys.executable, "-m", "services.cli.main"]
ROOT = Path(__file__).resolve().parents[2]
SPEC = "examples.custom_cnn:build"
ITEMS = 80


def ferret(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*FERRET, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"ferret {' '.join(args)} exited {out.returncode}:\n{out.stderr[-3000:]}"
    return out


def test_your_own_model_profile_plan_simulate_run(
    bootstrap_servers: str, redis_url: str, topic_prefix: str, tmp_path: Path
) -> None:
    profile = tmp_path / "custom_cnn.json"
    ferret("profile", "--model", SPEC, "--input-shape", "1,8,8", "--repeats", "3", "--out", str(profile))
    assert json.loads(profile.read_text())["model"] == SPEC

    plan = json.loads(ferret("plan", "--profile", str(profile), "--json").stdout)
    tight = (plan["min_feasible_bytes"] + plan["planned_bytes"]) // 2
    tight_plan = json.loads(ferret("plan", "--profile", str(profile), "--budget", str(tight), "--json").stdout)
    assert tight_plan["model"] == SPEC and tight_plan["planned_bytes"] <= tight

    simulated = json.loads(
        ferret(
            "simulate", "--dataset", "digits", "--model", SPEC, "--method", "ferret", "--profile", str(profile),
            "--items", "120", "--json",
        ).stdout
    )  # fmt: skip
    assert simulated["model"] == SPEC and simulated["items"] == 120 and simulated["trained_any_stage"] > 0

    import examples.custom_cnn as example

    weights = tmp_path / "weights.pt"
    torch.save(example.build((1, 8, 8), 10).state_dict(), weights)  # the user's own state dict
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=1)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FERRET_")},
        "FERRET_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "FERRET_KAFKA_TOPIC_PREFIX": topic_prefix,
        "FERRET_KAFKA_GROUP_ID": f"g-{topic_prefix}",
        "FERRET_KAFKA_INSTANCE_ID": "byo-0",
        "FERRET_REDIS_URL": redis_url,
        "FERRET_REDIS_NAMESPACE": topic_prefix,
        "FERRET_REDIS_SNAPSHOT_INTERVAL_S": "0",
        "FERRET_REDIS_HMAC_KEY": SNAPSHOT_KEY,
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": SPEC,
        "FERRET_TRAINER_PROFILE": str(profile),
        "FERRET_TRAINER_WEIGHTS": str(weights),
        "FERRET_TRAINER_BUDGET_BYTES": str(tight),
        "FERRET_TRAINER_MAX_WORKERS": "2",
        "FERRET_CONTROL_LISTEN": f"127.0.0.1:{free_port()}",
        "FERRET_METRICS_PORT": "0",
    }
    trainer = TrainerProcess(env, tmp_path / "trainer.log")
    client = ControlClient(trainer.target)
    try:
        served = json.loads(client.get_plan().plan_json)
        assert served["model"] == SPEC and served["planned_bytes"] <= tight
        ferret(
            "produce", "--dataset", "digits", "--items", str(ITEMS), "--rate", "max", "--quiet",
            "--bootstrap-servers", bootstrap_servers, "--topic-prefix", topic_prefix, "--no-create-topics",
            env=env,
        )  # fmt: skip
        wait_status(client, "predictions_published", ITEMS)
        status = client.get_status()
    finally:
        client.close()
        assert trainer.stop(signal.SIGTERM) == 0
    predictions = read_predictions(bootstrap_servers, TopicNames(topic_prefix).predictions, ITEMS)
    assert len({p.sample_id for p in predictions}) == ITEMS
    assert status.items_valid == ITEMS and status.items_dead_lettered == 0
