"""Wires a trainer process from its settings: model, profile, planner, learner, snapshots, control
plane, metrics and signals. ``ferret run`` calls :func:`run_trainer`."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ferret_core.data import dataset_spec
from ferret_core.errors import ConfigError
from ferret_core.memory_model import MemorySettings
from ferret_core.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel
from services.units import ArrivalInterval
from services.codec import SampleDecoder
from services.config import Settings
from services.control.auth import ServerTls
from services.control.server import ControlServer, create_server
from services.kafka.admin import ensure_topics
from services.metrics_http import serve_metrics
from services.models import build_model_for
from services.snapshots import SnapshotStore, redis_client
from services.trainer.arrivals import ArrivalRate, DriftReplanner, SwitchablePlanner
from services.trainer.metrics import TrainerMetrics
from services.trainer.service import Trainer
from services.units import ArrivalInterval

log = logging.getLogger("ferret.trainer")


@dataclass
class TrainerProcess:
    """The parts of a running trainer, for tests and the demo's in-process use."""

    trainer: Trainer
    control: ControlServer
    planner: SwitchablePlanner
    metrics_port: int | None
    drift: DriftReplanner | None = None


def sample_spec(settings: Settings) -> tuple[tuple[int, ...], int]:
    """(per-sample input shape, classes): ``trainer.input_shape`` / ``num_classes``, else the dataset's."""
    t = settings.trainer
    shape, classes = dataset_spec(t.dataset)
    return (t.input_shape or shape, t.num_classes or classes)


def build_zoo_model(settings: Settings) -> ZooModel:
    """``trainer.model``: a zoo name or your own ``package.module:factory`` (with ``trainer.weights``)."""
    shape, classes = sample_spec(settings)
    return build_model_for(
        settings.trainer.model, input_shape=shape, num_classes=classes, weights=settings.trainer.weights
    )


def load_profile(settings: Settings, model: ZooModel) -> ModelProfile:
    if settings.trainer.profile is not None:
        profile = ModelProfile.load(settings.trainer.profile)
        if profile.num_units != model.num_units:
            raise ConfigError(
                f"profile {str(settings.trainer.profile)!r} has {profile.num_units} units, model "
                f"{model.name!r} has {model.num_units}; profile the model with `ferret profile`"
            )
        return profile
    from ferret_core.profiler import profile_model

    log.info("profiling %s (no trainer.profile given)", model.name)
    return profile_model(model, device=settings.trainer.device)


def make_planner(settings: Settings, profile: ModelProfile) -> Planner:
    """The start-up planner. With ``arrival_interval: measured`` it starts at the paper's rate
    (max_i t̂_i^f) and :class:`DriftReplanner` re-plans once the stream's measured rate is known."""
    t = settings.trainer
    arrival = ArrivalInterval(multiple=1.0) if t.arrival_interval == "measured" else t.arrival_interval
    max_workers = t.max_workers if t.max_workers is not None else max(1, os.cpu_count() or 1)
    memory = MemorySettings(compensator=t.compensator)
    planner_settings = PlannerSettings(
        arrival_interval=arrival.resolve(profile.max_forward_time),
        decay=t.decay,
        memory=memory,
        max_workers=max_workers,
    )
    return Planner(profile, planner_settings)


def start_trainer(settings: Settings) -> TrainerProcess:
    """Build everything and start the control plane and metrics; the caller then runs the loop."""
    t = settings.trainer
    torch.set_num_threads(t.threads)
    torch.set_flush_denormal(True)
    model = build_zoo_model(settings)
    profile = load_profile(settings, model)
    planner = SwitchablePlanner(make_planner(settings, profile))
    planner.current.warm()  # before any gRPC thread can reach the planner
    plan = planner.plan(t.budget_bytes)
    from services.trainer.engine_learner import EngineLearner

    learner = EngineLearner(model, plan, settings)
    kafka = settings.kafka
    ensure_topics(kafka.bootstrap_servers, kafka.topic_prefix, sample_partitions=kafka.sample_partitions)
    r = settings.redis
    client = redis_client(r.url, socket_timeout_s=r.timeout_s)
    key = r.hmac_key.encode() if r.hmac_key is not None else None
    store = SnapshotStore(client, r.namespace, kafka.resolved_instance_id(), hmac_key=key)
    shape, classes = sample_spec(settings)
    holder: dict[str, ControlServer] = {}

    def snapshot_health(ok: bool) -> None:
        if "control" in holder:
            holder["control"].health.set_snapshots_ok(ok)

    measured = t.arrival_interval == "measured"
    drift_holder: list[DriftReplanner] = []
    trainer_holder: list[Trainer] = []
    rate = (
        ArrivalRate(partitions=lambda: trainer_holder[0].assigned_partitions if trainer_holder else ())
        if measured
        else None
    )

    def arrival(event_time_ms: int, partition: int) -> None:
        assert rate is not None
        estimate = rate.observe(event_time_ms, partition)
        if estimate is not None and drift_holder:
            drift_holder[0].offer(estimate)

    def assigned() -> None:
        if "control" in holder:
            holder["control"].health.set_ready(True)

    trainer = Trainer(
        settings,
        learner,
        plan,
        SampleDecoder(shape, classes, input_range=t.input_range, normaliser=t.input_normaliser),
        store,
        on_snapshot_health=snapshot_health,
        on_assigned=assigned,
        on_arrival=arrival if measured else None,
    )
    trainer_holder.append(trainer)
    restored = trainer.restore_latest()
    if restored is not None:
        log.info("restored snapshot v%s; resuming at %s", restored.version, restored.offsets)
    c = settings.control
    tls = ServerTls(c.tls_cert, c.tls_key) if c.tls_cert is not None and c.tls_key is not None else None
    # Not ready until the consumer has its partitions (the first assignment flips readiness on).
    control = create_server(
        planner,
        trainer,
        address=c.listen,
        token=c.token,
        tls=tls,
        insecure=c.insecure,
        health_address=c.health_listen,
        ready=False,
    ).start()
    holder["control"] = control
    drift = None
    if measured:

        def request(budget: int | None) -> object:
            # the re-planner takes a byte budget: "unconstrained" is the unconstrained plan's own bytes
            return control.replanner.request(budget if budget is not None else planner.plan(None).predicted_bytes)

        drift = DriftReplanner(
            planner, request, lambda: trainer.current_plan()[0].budget_bytes, ratio=t.arrival_drift_ratio
        ).start()
        drift_holder.append(drift)
    metrics_port = None
    if settings.metrics.port is not None:
        metrics = TrainerMetrics(trainer.status, lambda: dict(learner.stats()))
        trainer.on_latency = metrics.latency.observe
        metrics_port = serve_metrics(metrics.registry, settings.metrics).port
    log.info(
        "trainer %s: control plane on %s, metrics on %s", kafka.resolved_instance_id(), control.target, metrics_port
    )
    return TrainerProcess(trainer, control, planner, metrics_port, drift)


def run_trainer(settings: Settings, *, on_ready: Callable[[TrainerProcess], None] | None = None) -> int:
    """Run until SIGTERM/SIGINT: then drain, snapshot, commit and stop the control plane (exit 0)."""
    process = start_trainer(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if on_ready is not None:
        on_ready(process)
    try:
        process.trainer.run(stop)
    finally:
        if process.drift is not None:
            process.drift.close()
        process.control.stop(grace_s=5)
    return 0
