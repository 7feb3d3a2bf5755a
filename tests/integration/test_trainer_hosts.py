"""``ferret run`` over two "hosts": two ``torchrun`` launchers on loopback run the same command with
``trainer.hosts: torchrun``, as two machines would; rank 0 is the trainer (consume, predict, publish,
commit, control plane) and rank 1 owns the stages and their executor processes (services/hosts). A real
broker and Redis (the session's fixtures)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.control.client import ControlClient
from services.control.health import LIVENESS, READINESS
from services.hosts.loopback import free_port, torchrun_argv
from services.kafka.admin import TopicNames

from .test_trainer_process import executor_processes, trainer_env, wait_status  # noqa: F401  (a fixture)
from .trainer_support import produce_digits, read_predictions, wait_serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
HOST_BUDGET = 256 * 2**20  # each host's budget (trainer.host_budget_bytes): far above what the digits MLP needs


def rank_of(pid: int) -> int | None:
    """The torchrun RANK a launcher's worker process was started with (None: not a worker)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"RANK="):
            return int(entry[5:])
    return None


def workers(launchers: list[subprocess.Popen[bytes]], timeout: float = 60.0) -> dict[int, tuple[int, int]]:
    """rank → (pid of its worker process, index of its launcher)."""
    deadline = time.monotonic() + timeout
    while True:
        found: dict[int, tuple[int, int]] = {}
        for n, launcher in enumerate(launchers):
            for task in Path(f"/proc/{launcher.pid}/task").glob("*"):
                for child in (task / "children").read_text().split():
                    rank = rank_of(int(child))
                    if rank is not None:
                        found[rank] = (int(child), n)
        if len(found) == len(launchers):
            return found
        assert time.monotonic() < deadline, f"workers not started: {found}"
        time.sleep(0.2)


@contextlib.contextmanager
def launched(
    argvs: list[list[str]], envs: list[dict[str, str]], logs: list[Path]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The launchers of one job, each writing to its log; killed (if still running) on the way out."""
    handles = [log.open("wb") for log in logs]
    launchers = [
        subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
        for argv, env, handle in zip(argvs, envs, handles, strict=True)
    ]
    try:
        yield launchers
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait(10)
        for handle in handles:
            handle.close()


def tails(logs: list[Path]) -> str:
    return "\n---\n".join(log.read_text(errors="replace")[-4000:] for log in logs)


def end_job(trainer_pid: int, launchers: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    """SIGTERM to the trainer (rank 0's worker) drains, snapshots, commits and ends the job: every launcher
    exits 0."""
    os.kill(trainer_pid, signal.SIGTERM)
    codes = [launcher.wait(90) for launcher in launchers]
    assert codes == [0] * len(launchers), f"launchers exited {codes}\n{tails(logs)}"


def test_the_trainer_trains_on_the_other_hosts_executors(trainer_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    """The stage lives on rank 1: its executor processes run there, none under the trainer; every item gets
    exactly one prediction and items are trained; SIGTERM to the trainer drains, snapshots and ends the job:
    both launchers exit 0."""
    bootstrap, prefix = trainer_env["FERRET_KAFKA_BOOTSTRAP_SERVERS"], trainer_env["FERRET_KAFKA_TOPIC_PREFIX"]
    topics = TopicNames(prefix)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**trainer_env, "FERRET_TRAINER_HOSTS": "torchrun", "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    env["FERRET_TRAINER_HOST_BUDGET_BYTES"] = str(HOST_BUDGET)
    argv = [*torchrun_argv(2, free_port(), f"trainer-{prefix}"), "-m", "services.cli.main", "run"]
    logs = [tmp_path / f"launcher{n}.log" for n in range(2)]
    health = [f"127.0.0.1:{free_port()}" for _ in logs]  # one machine: each "host" its own health port
    envs = [{**env, "FERRET_CONTROL_HEALTH_LISTEN": address} for address in health]
    with launched([argv, argv], envs, logs) as launchers:
        ranks = workers(launchers)
        wait_serving(launchers[0], env["FERRET_CONTROL_LISTEN"], logs[0], timeout=120.0)
        with ControlClient(env["FERRET_CONTROL_LISTEN"]) as client:
            ids = produce_digits(bootstrap, topics.samples, 120)
            wait_status(client, "predictions_published", 120)
            status = client.get_status()
            assert status.items_dispatched > 0 and status.backward_passes > 0, tails(logs)  # trained there
            # predictions read follower copies of the remote stage: how far behind, in GetStatus
            counters = dict(status.counters)
            assert counters["freshness_predictions"] > 0, counters
            assert 0 <= counters["freshness_updates_p50"] <= counters["freshness_updates_p99"]
            assert counters["freshness_updates_p99"] <= counters["freshness_updates_max"]
            # the plan's bytes on each host, within trainer.host_budget_bytes: rank 1 holds the stage, rank 0
            # the record path and its follower copy of the stage
            per_host = [counters["planned_host_bytes.0"], counters["planned_host_bytes.1"]]
            assert 0 < per_host[0] <= HOST_BUDGET and 0 < per_host[1] <= HOST_BUDGET, counters
            assert list(client.get_plan().host_bytes) == per_host
            # the executors are processes under rank 1's agent; the trainer's host runs none
            assert executor_processes(ranks[1][0]), tails(logs)
            assert not executor_processes(ranks[0][0]), tails(logs)
        # the kubelet's view of the serving rank: live, never Ready (control calls go to the trainer only)
        assert health_status(health[ranks[1][1]], LIVENESS) == health_pb2.HealthCheckResponse.SERVING
        assert health_status(health[ranks[1][1]], READINESS) == health_pb2.HealthCheckResponse.NOT_SERVING
        # the trainer is Ready, except while a re-plan runs (a rate re-plan's new clock, slow under load): wait
        deadline = time.monotonic() + 60.0
        while health_status(health[ranks[0][1]], READINESS) != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, f"the trainer never became Ready\n{tails(logs)}"
            time.sleep(0.2)
        end_job(ranks[0][0], launchers, logs)
    predictions = read_predictions(bootstrap, topics.predictions, 120)
    assert sorted(p.sample_id for p in predictions) == sorted(ids)  # exactly one each
    assert not any(p.duplicate for p in predictions)
    assert "stage(s) owned by ranks [1] of 2 hosts" in tails(logs)


def health_status(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status)


def test_supervise_is_refused_with_hosts(trainer_env: dict[str, str]) -> None:  # noqa: F811
    done = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "run", "--supervise"],
        env={**trainer_env, "FERRET_TRAINER_HOSTS": "torchrun"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "torchrun --max-restarts" in done.stderr, done.stderr[-2000:]
