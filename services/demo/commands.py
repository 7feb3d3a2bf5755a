"""The demo's children, ``ferret run`` and ``ferret produce``: command lines, environments, the trainer's
readiness probe and what their logs say.

Both are separate processes that talk to the broker, Redis and each other over loopback only. The
trainer gets its addresses as flags and the rest as ``FERRET_<SECTION>_<KEY>`` variables (DESIGN §4
"Config"); the caller's own ``FERRET_*`` variables pass through, so e.g. ``FERRET_TRAINER_COMPENSATOR``
still tunes the demo's trainer, but the ones set here win. The trainer signs its snapshots with the local
stack's random key, unless the caller names its own ``FERRET_REDIS_HMAC_KEY`` (kept: an external Redis's
snapshots stay verifiable from one run to the next).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.demo.options import DemoOptions
from services.localstack.process import log_tail

SNAPSHOT_NAMESPACE = "ferret"  # redis.namespace of the demo's trainer (its snapshots are read back)
SNAPSHOT_KEY_ENV = "FERRET_REDIS_HMAC_KEY"
_DELIVERED = re.compile(r"delivered (\d+), failed (\d+)")
# Reconnect quickly while the trainer's port is not open yet (gRPC's default back-off grows to 120 s).
_FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


@dataclass(frozen=True)
class Endpoints:
    """Where the run's services are: the broker, Redis, and the trainer's control and metrics ports."""

    bootstrap_servers: str
    redis_url: str
    control_target: str  # host:port of the trainer's gRPC control plane
    metrics_port: int


def trainer_identity(options: DemoOptions) -> tuple[str, str]:
    """``(group id, instance id)`` of the run's trainer: fresh per run, so a reused external broker or
    Redis never hands it another run's offsets or snapshots."""
    return f"{options.topic_prefix}-trainer", options.topic_prefix


def trainer_command(options: DemoOptions, endpoints: Endpoints) -> list[str]:
    """``ferret run --supervise`` for the demo's stream: a trainer that stops on a failure is started again
    and resumes from its last snapshot (services/supervisor.py)."""
    argv = [
        *options.ferret_command,
        "run",
        "--supervise",
        "--bootstrap-servers",
        endpoints.bootstrap_servers,
        "--redis-url",
        endpoints.redis_url,
        "--topic-prefix",
        options.topic_prefix,
        "--dataset",
        options.dataset,
        "--model",
        options.model,
        "--listen",
        endpoints.control_target,
        "--metrics-port",
        str(endpoints.metrics_port),
        "--log-format",
        options.log_format,
    ]
    if options.budget is not None:
        argv += ["--budget", str(options.budget)]
    if options.profile is not None:
        argv += ["--profile", str(options.profile)]
    return argv


def trainer_env(options: DemoOptions, snapshot_key: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trainer's environment: ``base`` (default ``os.environ``) with the demo's settings, and
    ``snapshot_key`` as the snapshots' signing key unless ``base`` names one."""
    group_id, instance_id = trainer_identity(options)
    env = dict(os.environ if base is None else base)
    if not env.get(SNAPSHOT_KEY_ENV):
        env[SNAPSHOT_KEY_ENV] = snapshot_key
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "FERRET_KAFKA_SAMPLE_PARTITIONS": str(options.partitions),
            "FERRET_KAFKA_GROUP_ID": group_id,
            "FERRET_KAFKA_INSTANCE_ID": instance_id,
            "FERRET_REDIS_SNAPSHOT_INTERVAL_S": f"{options.snapshot_interval_s:g}",
            "FERRET_REDIS_NAMESPACE": SNAPSHOT_NAMESPACE,
            # the demo knows its stream's rate: plan for it from the start (no re-plan at the first record)
            "FERRET_TRAINER_STREAM_RATE": f"{options.rate:g}",
        }
    )
    return env


def producer_command(options: DemoOptions, endpoints: Endpoints) -> list[str]:
    argv = [
        *options.ferret_command,
        "produce",
        "--dataset",
        options.dataset,
        "--bootstrap-servers",
        endpoints.bootstrap_servers,
        "--topic-prefix",
        options.topic_prefix,
        "--partitions",
        str(options.partitions),
        "--rate",
        f"{options.rate:g}",
        "--items",
        str(options.items),
        "--no-create-topics",
        "--quiet",
        "--log-format",
        options.log_format,
    ]
    if options.data_root is not None:
        argv += ["--data-root", str(options.data_root)]
    return argv


def producer_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def serving_probe(target: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    """``(probe, close)``: ``probe()`` asks the standard health service (overall status) with a short
    deadline, waiting for the channel to connect within it."""
    channel = grpc.insecure_channel(target, options=_FAST_RECONNECT)
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="")

    def probe() -> bool:
        try:
            reply = stub.Check(request, timeout=1.0, wait_for_ready=True)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    return probe, channel.close


def last_log_line(log_path: Path) -> str:
    """``": <last line>"`` of a log (a traceback's exception, a CLI's one-line error), or ``""``."""
    lines = [line.strip() for line in log_tail(log_path, lines=5).splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1].removeprefix("ferret: error: ")
    return f": {last[:300]}"


def delivered_count(log_path: Path) -> int | None:
    """Samples delivered, from ``ferret produce``'s final report line in its log."""
    matches = _DELIVERED.findall(log_tail(log_path, lines=50))
    return int(matches[-1][0]) if matches else None
