"""docker-compose.hosts.yml's two launchers, run as the file writes them, on this machine: the trainer's
command behind its entrypoint (the snapshot signing key, then ``exec "$@"``) and trainer-host-1's, with
only the addresses made local (the ``trainer`` service name → 127.0.0.1, its rendezvous port → a free one)
and the demo's model knob set to the MLP. The static rendezvous makes the trainer node rank 0, the host
rank 1, which owns the stages and runs their executors; a real broker and Redis (the session's fixtures)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from services.control.client import ControlClient
from services.control.health import LIVENESS
from services.hosts.loopback import free_port
from services.kafka.admin import TopicNames
from tests import compose_files
from tests.compose_files import service_env

from .test_trainer_hosts import end_job, health_status, launched, tails, workers
from .test_trainer_process import executor_processes, trainer_env, wait_status  # noqa: F401  (a fixture)
from .trainer_support import produce_digits, read_predictions, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
JOB_SETTINGS = "FERRET_TRAINER_"  # the job's own settings from the compose file; endpoints stay the fixture's


def local(command: list[str], port: int) -> list[str]:
    """The launcher's command with the rendezvous at 127.0.0.1:``port`` instead of trainer:29400."""
    out = []
    for arg in command:
        if arg.startswith("--master-addr="):
            assert arg == "--master-addr=trainer", arg
            arg = "--master-addr=127.0.0.1"
        elif arg.startswith("--master-port="):
            arg = f"--master-port={port}"
        out.append(arg)
    return out


def test_the_hosts_variant_runs_one_trainer_over_its_two_launchers(
    trainer_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    services = compose_files.compose(compose_files.BASE, compose_files.HOSTS, env={"FERRET_TRAINER_MODEL": "mlp"})[
        "services"
    ]
    trainer, host = services["trainer"], services["trainer-host-1"]
    bootstrap, prefix = trainer_env["FERRET_KAFKA_BOOTSTRAP_SERVERS"], trainer_env["FERRET_KAFKA_TOPIC_PREFIX"]
    topics = TopicNames(prefix)
    port = free_port()
    volume = tmp_path / "ferret-keys"
    volume.mkdir()
    sh, flag, script, argv0 = trainer["entrypoint"]
    argvs = [
        [sh, flag, script.replace("/var/lib/ferret", str(volume)), argv0, *local(trainer["command"], port)],
        [*host["entrypoint"], *local(host["command"], port)],
    ]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    common = {
        **trainer_env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # torchrun, ferret
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
    }
    health = f"127.0.0.1:{free_port()}"
    envs = [
        {
            **common,
            **{k: v for k, v in service_env(trainer).items() if k.startswith(JOB_SETTINGS)},
            "FERRET_REDIS_HMAC_KEY": service_env(trainer)["FERRET_REDIS_HMAC_KEY"],  # empty: the entrypoint's key
        },
        {
            **common,
            **{k: v for k, v in service_env(host).items() if k.startswith(JOB_SETTINGS)},
            "FERRET_CONTROL_HEALTH_LISTEN": health,
        },
    ]
    logs = [tmp_path / "trainer.log", tmp_path / "trainer-host-1.log"]
    with launched(argvs, envs, logs) as launchers:
        ranks = workers(launchers)
        assert {rank: launcher for rank, (_, launcher) in ranks.items()} == {0: 0, 1: 1}  # --node-rank
        wait_serving(launchers[0], common["FERRET_CONTROL_LISTEN"], logs[0], timeout=120.0)
        with ControlClient(common["FERRET_CONTROL_LISTEN"]) as client:
            ids = produce_digits(bootstrap, topics.samples, 80)
            wait_status(client, "predictions_published", 80)
            status = client.get_status()
            assert status.items_dispatched > 0 and status.backward_passes > 0, tails(logs)
        assert executor_processes(ranks[1][0]) and not executor_processes(ranks[0][0]), tails(logs)
        assert health_status(health, LIVENESS) == health_pb2.HealthCheckResponse.SERVING
        probe = host["healthcheck"]["test"]  # the compose healthcheck's own command, at the local port
        assert probe[:3] == ["CMD", "python", "-c"]
        code = probe[3].replace(f"127.0.0.1:{health_port(service_env(host))}", health)
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0
        end_job(ranks[0][0], launchers, logs)
    predictions = read_predictions(bootstrap, topics.predictions, 80)
    assert sorted(p.sample_id for p in predictions) == sorted(ids)  # exactly one each
    assert "stage(s) owned by ranks [1] of 2 hosts" in tails(logs)
    key = volume / "snapshot-hmac-key"  # the entrypoint made the trainer's signing key before torchrun
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text().strip()) == 64


def health_port(env: dict[str, str]) -> str:
    return env["FERRET_CONTROL_HEALTH_LISTEN"].rsplit(":", 1)[1]
