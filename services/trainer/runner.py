"""Wires a trainer process from its settings: model, profile, planner, learner, snapshots, the record
path, control plane, metrics and signals. ``ferret run`` calls :func:`run_trainer`.

Everything is built first and passed in, in dependency order (grpc's ``create_server(address, deps)``
examples): :func:`assemble` builds the trainer's parts from a learner (no Kafka, gRPC or Redis traffic:
tests use it with their own learner), :func:`start_trainer` adds the model, planner, control plane and
metrics around them, and only the drift re-planner is handed the control plane's request when it starts.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ferret_core.data import dataset_spec
from ferret_core.engine.heap import retain_freed_memory
from ferret_core.engine.processes.executor import start_executor_parent
from ferret_core.engine.processes.hosts import Hosts
from ferret_core.engine.staleness_calibration import CalibrationSettings
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.planning.admission_queue import AdmissionQueue
from ferret_core.planning.host_memory import HostBudget
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.planning.profiler import resolve_device
from ferret_core.planning.staleness_cost import StalenessCost
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel
from services.config import Settings
from services.control.auth import ServerTls
from services.control.health import ControlHealth
from services.control.server import ControlServer, create_server
from services.control.trainer_port import SnapshotInfo
from services.failpoints import configure as configure_failpoints
from services.hosts.job import end_job, trainer_hosts
from services.kafka.admin import ensure_topics
from services.kafka.record_codec import SampleDecoder
from services.models import build_model_for
from services.serving.model_card import ModelCard
from services.serving.model_stream import ModelStreamWriter, stream_key
from services.snapshots import Reconnect, SnapshotStore, redis_client, signing_key
from services.trainer.arrivals import DriftReplanner, SwitchablePlanner, measured_time_scale
from services.trainer.calibration import compensation_seconds, startup_time_scale
from services.trainer.checkpoints import Checkpoints, no_guard
from services.trainer.counters import StreamCounters
from services.trainer.executors import (
    ExecutorChoice,
    choose_executors,
    executor_caps,
    make_learner,
    process_refusal,
    refused,
)
from services.trainer.failure_log import RedisFailureLog
from services.trainer.failures import ErrorPolicy
from services.trainer.labels import LateLabelJoin
from services.trainer.learner import Learner
from services.trainer.ledger import OffsetLedger
from services.trainer.live_methods import DELIVERY_ITEMS, DELIVERY_SPREAD_S, FixedPlan, budget_methods, plans_for_budget
from services.trainer.loop_calls import LoopCalls
from services.trainer.metrics import TrainerMetrics
from services.trainer.metrics_http import serve_metrics
from services.trainer.model_updates import ModelPublisher, ModelStreamCollector
from services.trainer.priority import lower_record_path_priority
from services.trainer.service import Trainer
from services.trainer.staleness_live import SEED_BASE, LiveCalibration, ModelSpec
from services.trainer.state import Lifecycle, PlanInForce
from services.trainer.status import StatusView
from services.trainer.stream import RecordStream, StreamHooks

log = logging.getLogger("ferret.trainer")


@dataclass(frozen=True)
class TrainerParts:
    """A trainer's parts: run ``stream.run(stop)`` on a thread of its own; the control plane calls
    ``port``; ``checkpoints.restore_latest()`` before running resumes from the newest snapshot."""

    stream: RecordStream
    port: Trainer
    checkpoints: Checkpoints
    status: StatusView
    learner: Learner
    counters: StreamCounters

    def restore_latest(self) -> SnapshotInfo | None:
        """Start-up: apply the newest valid snapshot, if any, and resume from its offsets."""
        restored = self.checkpoints.restore_latest()
        if restored is None:
            return None
        self.stream.resume_from(restored.offsets)
        log.info("restored snapshot v%s; resuming at %s", restored.info.version, restored.info.offsets)
        return restored.info


@dataclass(frozen=True)
class TrainerProcess:
    """The parts of a running trainer, for tests and the demo's in-process use."""

    parts: TrainerParts
    control: ControlServer
    planner: SwitchablePlanner
    metrics_port: int | None
    drift: DriftReplanner | None = None
    models: ModelPublisher | None = None  # the model stream's publisher (None: trainer.models_interval_s 0)
    hosts: Hosts | None = None  # the job's other hosts (trainer.hosts: torchrun), ended with the trainer
    calibration: LiveCalibration | None = None  # the staleness cost calibrated on the stream's head


def model_card(settings: Settings) -> ModelCard:
    """What rebuilds the trainer's model elsewhere (exports, the model stream, ``ferret serve``)."""
    t = settings.trainer
    shape, classes = sample_spec(settings)
    return ModelCard(t.model, shape, classes, t.input_range, t.input_normaliser)


def sample_spec(settings: Settings) -> tuple[tuple[int, ...], int]:
    """(per-sample input shape, classes): ``trainer.input_shape`` / ``num_classes``, else the dataset's."""
    t = settings.trainer
    shape, classes = dataset_spec(t.dataset)
    return (t.input_shape or shape, t.num_classes or classes)


@dataclass(frozen=True)
class OnAssigned:
    """What a change of the owned partitions tells others: the measured rate which partitions to wait for,
    and readiness that the trainer can take the stream now (producers waiting for it do not pile up a backlog
    during the group join), unless it has owned no partition for ``unassigned_s`` (ControlHealth)."""

    health: ControlHealth
    drift: DriftReplanner | None = None
    unassigned_s: float = 30.0

    def __call__(self, partitions: frozenset[int]) -> None:
        if self.drift is not None:
            self.drift.assign(partitions)
        self.health.set_ready(True)
        self.health.set_owns_partitions(bool(partitions), self.unassigned_s)


def assemble(
    settings: Settings,
    learner: Learner,
    decoder: SampleDecoder,
    store: SnapshotStore | None,
    *,
    hooks: StreamHooks | None = None,
    health: ControlHealth | None = None,
    policy: ErrorPolicy | None = None,
    snapshot_on_stop: bool = True,
    link: Reconnect | None = None,
) -> TrainerParts:
    """The trainer's parts around ``learner``, each built once with what it needs. ``link``: Redis's
    reachability (degraded mode, :class:`~services.snapshots.Reconnect`); ``health`` also reports a
    snapshot that holds the record path longer than ``redis.stall_s`` (readiness)."""
    instance_id = settings.kafka.resolved_instance_id()
    plan = PlanInForce(learner.plan)
    lifecycle = Lifecycle()
    counters = StreamCounters()
    ledger = OffsetLedger()
    checkpoints = Checkpoints(
        store=store,
        learner=learner,
        plan=plan,
        counters=counters,
        ledger=ledger,
        lifecycle=lifecycle,
        samples_topic=settings.kafka.topics.samples,
        instance_id=instance_id,
        keep=settings.redis.keep,
        interval_s=settings.redis.snapshot_interval_s,
        snapshot_on_stop=snapshot_on_stop,
        on_health=health.set_snapshots_ok if health is not None else lambda ok: None,
        link=link,
        stall_guard=health.readiness_deadline if health is not None else no_guard,
        stall_s=settings.redis.resolved_stall_s(),
        model_card=model_card(settings).to_dict(),
    )
    calls = LoopCalls()
    stream = RecordStream(
        kafka=settings.kafka,
        learner=learner,
        decoder=decoder,
        counters=counters,
        ledger=ledger,
        labels=LateLabelJoin(settings.trainer.label_window),
        plan=plan,
        lifecycle=lifecycle,
        checkpoints=checkpoints,
        calls=calls,
        policy=policy or ErrorPolicy(max_failures=settings.trainer.max_record_failures),
        hooks=hooks or StreamHooks(),
    )
    status = StatusView(
        instance_id=instance_id,
        counters=counters,
        ledger=ledger,
        learner=learner,
        plan=plan,
        lifecycle=lifecycle,
        checkpoints=checkpoints,
        lag=stream.lag,
    )
    port = Trainer(
        stream=stream,
        checkpoints=checkpoints,
        calls=calls,
        status_view=status,
        learner=learner,
        plan=plan,
        lifecycle=lifecycle,
        counters=counters,
    )
    return TrainerParts(stream, port, checkpoints, status, learner, counters)


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
        profile.check_input(model.input_shape, source=f"profile {str(settings.trainer.profile)!r}")
        return profile
    from ferret_core.planning.profiler import profile_model

    log.info("profiling %s (no trainer.profile given)", model.name)
    return profile_model(model, device=settings.trainer.device)


def startup_interval(settings: Settings, profile: ModelProfile) -> float:
    """t^d of the start-up plan. ``measured`` (the default: the stream's own rate): 1 / ``trainer.stream_rate``
    when the config declares it, else one worker's pace Σ_i (t̂_i^f + t̂_i^b) (one worker, every item
    trained, the smallest plan) until a record's declared rate or the measured rate re-plans
    (:mod:`services.trainer.arrivals`). A configured interval (``auto``, ``Kx``, seconds) is fixed."""
    t = settings.trainer
    if t.arrival_interval != "measured":
        return t.arrival_interval.resolve(profile.max_forward_time)
    if t.stream_rate is not None:
        return 1.0 / t.stream_rate
    return profile.sequential_time


StartTiming = tuple[float, float] | None  # (time scale k, seconds per stale gradient's compensation)


def make_planner(
    settings: Settings, profile: ModelProfile, choice: ExecutorChoice | None = None, *, timing: StartTiming = None
) -> Planner:
    """The start-up planner, capped by the executors that will run its plans (``choice``; default: the
    rule of :func:`~services.trainer.executors.choose_executors`), reading the profile in the machine's time
    and counting a stale gradient's compensation as ``timing`` measured (:func:`start_timing`; None: the
    profile's time, compensation not counted)."""
    time_scale, compensation_time = timing or (1.0, 0.0)
    t = settings.trainer
    choice = choice or choose_executors(settings, profile)
    max_workers, max_stages = executor_caps(settings, choice)
    # the wall clock's admission queue is part of the plan's bytes (K inputs per live worker, docs/service.md)
    queue = AdmissionQueue(DELIVERY_SPREAD_S, DELIVERY_ITEMS)
    memory = MemorySettings(compensator=t.compensator, admission_queue=queue, executors=choice.kind)
    # several hosts: each host's bytes, within trainer.host_budget_bytes where set (ferret_core.planning.host_memory)
    hosts = HostBudget(choice.hosts, t.host_budget_bytes) if t.hosts != "off" else None
    cost = None if t.staleness_cost is None else StalenessCost.load(t.staleness_cost, "trainer.staleness_cost")
    planner_settings = PlannerSettings(
        arrival_interval=startup_interval(settings, profile),
        decay=t.decay,
        memory=memory,
        max_workers=max_workers,
        max_stages=max_stages,
        time_scale=time_scale,
        compensation_time=compensation_time,
        hosts=hosts,
        # no cost yet: R_F until the trainer has calibrated one on the stream (services/trainer/staleness_live.py)
        objective=t.objective if cost is not None else "rate",
        staleness_cost=cost,
    )
    return Planner(profile, planner_settings)


def live_calibration(
    settings: Settings, planner: SwitchablePlanner, budget: Callable[[], int | None]
) -> LiveCalibration | None:
    """``trainer.objective: accuracy`` without ``trainer.staleness_cost``: the cost calibrated on the
    stream's first labelled items (:mod:`services.trainer.staleness_live`); else None."""
    t = settings.trainer
    if t.objective != "accuracy" or t.staleness_cost is not None:
        return None
    shape, classes = sample_spec(settings)
    spec = ModelSpec(t.model, shape, classes, None if t.weights is None else str(t.weights))
    seeds = tuple(range(SEED_BASE, SEED_BASE + t.calibration_seeds))
    calibration = CalibrationSettings(seeds=seeds, lr=t.lr)
    head = f"the live stream's first {t.calibration_items} labelled items"
    source = f"{head}, {t.model}, lr {t.lr:g}, seeds {list(seeds)}"
    return LiveCalibration(planner, budget, spec, items=t.calibration_items, settings=calibration, source=source)


def start_timing(settings: Settings, model: ZooModel, profile: ModelProfile) -> StartTiming:
    """The start-up plan's k and compensation time, measured here (:mod:`services.trainer.calibration`) when
    the trainer plans for the stream's own rate (``arrival_interval: measured``) and ``trainer.calibrate_time``
    is on; else None (the profile's time, as the paper plans)."""
    t = settings.trainer
    if not t.calibrate_time or t.arrival_interval != "measured":
        return None
    device = resolve_device(t.device)
    scale = startup_time_scale(profile, model, device)
    compensation = compensation_seconds(model, t.compensator, device, t.compensator_config())
    log.info("start-up compensation time: %.3g ms per stale gradient (%s)", compensation * 1e3, t.compensator)
    return scale, compensation


def plan_executors(
    settings: Settings, model: ZooModel, profile: ModelProfile, *, timing: StartTiming = None, hosts: int = 1
) -> tuple[ExecutorChoice, SwitchablePlanner, Plan]:
    """The executors, the planner capped for them and the start-up plan. Where the method or compensator
    does not run on process executors, ``auto`` falls back to threads (re-planned with their caps) and a
    configured ``processes`` (or several hosts) is a :class:`ConfigError`. ``hosts``: the job's size under
    ``trainer.hosts: torchrun``."""
    choice = choose_executors(settings, profile, hosts=hosts)
    planner = SwitchablePlanner(make_planner(settings, profile, choice, timing=timing))
    planner.current.warm()  # before any gRPC thread can reach the planner
    plan = planner.plan(settings.trainer.budget_bytes)
    if choice.kind == "processes":
        refusal = process_refusal(settings, model, profile, plan)
        if refusal is not None:
            choice = refused(choice, refusal)
            planner = SwitchablePlanner(make_planner(settings, profile, choice, timing=timing))
            planner.current.warm()
            plan = planner.plan(settings.trainer.budget_bytes)
    return choice, planner, plan


def start_trainer(settings: Settings) -> TrainerProcess:
    """Build everything and start the control plane and metrics; the caller then runs the loop."""
    t = settings.trainer
    configure_failpoints()  # test-only fault injection (FERRET_FAILPOINT); an unknown name fails here
    budgeted = plans_for_budget(t.method)
    if t.budget_bytes is not None and not budgeted:
        raise ConfigError(
            f"trainer.budget_bytes is {t.budget_bytes} but method {t.method!r} does not plan for a memory budget "
            f"(its plan is fixed); unset trainer.budget_bytes / --budget, or use one of {', '.join(budget_methods())}"
        )
    snapshot_key = signing_key(settings.redis)  # no key and no allow_unsigned: refused before the slow parts
    torch.set_num_threads(t.threads)
    torch.set_flush_denormal(True)
    # freed tensor memory stays in the heap: no page faults for the same megabytes every item (its executor
    # processes do the same, ProcessSettings.retain_heap)
    if t.retain_freed_memory and not retain_freed_memory():
        log.info("trainer.retain_freed_memory: the C library is not glibc, so freed memory goes back to the system")
    # 1. the model, its profile, the planner and the start-up plan
    model = build_zoo_model(settings)
    profile = load_profile(settings, model)
    # several hosts: join the torchrun job as its rank 0 (the others serve the stages: services/hosts)
    hosts = trainer_hosts(t.follow_share) if t.hosts == "torchrun" else None
    world = 1 if hosts is None else hosts.world_size
    timing = start_timing(settings, model, profile)
    choice, planner, plan = plan_executors(settings, model, profile, timing=timing, hosts=world)
    # 2. the learner, the topics, the snapshot store
    learner = make_learner(choice, model, plan, settings, profile, hosts)
    if choice.kind == "processes" and t.record_path_nice > 0:
        start_executor_parent()  # running already once the learner's clock started its executors
        log.info("trainer.record_path_nice: %s", lower_record_path_priority(t.record_path_nice).describe())
    kafka = settings.kafka
    ensure_topics(kafka.bootstrap_servers, kafka.topic_prefix, sample_partitions=kafka.sample_partitions)
    r = settings.redis
    client = redis_client(r.url, socket_timeout_s=r.timeout_s)
    store = SnapshotStore(client, r.namespace, kafka.resolved_instance_id(), hmac_key=snapshot_key)
    # 3. what the record path reports to: readiness, the measured arrival rate, the latency histogram
    health = ControlHealth(ready=False)  # not ready until the consumer has its partitions
    drift = None
    if t.arrival_interval == "measured" and budgeted:  # a fixed plan has nothing to re-plan
        drift = DriftReplanner(
            planner,
            lambda: learner.plan.budget_bytes,
            ratio=t.arrival_drift_ratio,
            time_scale=lambda: measured_time_scale(
                profile, learner.plan, learner.measured_service_times(), planner.current.settings.compensation_time
            ),
            plan_in_force=lambda: learner.plan,
        )
    calibration = live_calibration(settings, planner, lambda: learner.plan.budget_bytes) if budgeted else None
    metrics = TrainerMetrics()  # served below when metrics.port is set
    models = None  # the model stream `ferret serve` follows: a copy of the master every models_interval_s
    if t.models_interval_s > 0:
        writer = ModelStreamWriter(client, stream_key(r.namespace, kafka.resolved_instance_id()), keep=t.models_keep)
        models = ModelPublisher(learner.master_tensors, writer, model_card(settings), t.models_interval_s)
    hooks = StreamHooks(
        on_assigned=OnAssigned(health, drift, kafka.unassigned_readiness_s),
        on_arrival=drift.observe if drift is not None else StreamHooks.on_arrival,
        on_sample=calibration.observe if calibration is not None else StreamHooks.on_sample,
        on_latency=metrics.observe_latency_ms,
        on_batch=models.tick if models is not None else StreamHooks.on_batch,
    )
    # 4. the trainer's parts, and the metrics' view of their status
    shape, classes = sample_spec(settings)
    decoder = SampleDecoder(shape, classes, input_range=t.input_range, normaliser=t.input_normaliser)
    # Redis down: degraded, retried with backoff; credentials refused at start: SnapshotAuthError, unless optional
    link = Reconnect(store.ping, on_change=health.set_snapshots_ok, optional=r.optional)
    policy = ErrorPolicy(
        failures=RedisFailureLog(client, r.namespace, kafka.group_id), max_failures=t.max_record_failures
    )
    parts = assemble(settings, learner, decoder, store, hooks=hooks, health=health, policy=policy, link=link)
    if calibration is not None:
        parts.status.extra_counters.append(calibration.counters)
    metrics.register(parts.status.status, parts.status.mean_staleness)
    if models is not None:
        metrics.registry.register(ModelStreamCollector(models.stats))
    parts.restore_latest()
    # 5. the control plane over the port, and the drift re-planner requesting through it
    c = settings.control
    tls = ServerTls(c.tls_cert, c.tls_key) if c.tls_cert is not None and c.tls_key is not None else None
    control_planner = planner if budgeted else FixedPlan(t.method)  # a fixed plan refuses every budget
    control = create_server(
        control_planner,
        parts.port,
        address=c.listen,
        token=c.token,
        tls=tls,
        insecure=c.insecure,
        health_address=c.health_listen,
        health_state=health,
        on_replan=metrics.observe_replan,
    ).start()
    if drift is not None:
        # rate re-plans keep the budget in force, None (unconstrained) included
        drift.start(control.replanner.request)
    if calibration is not None:  # so does the re-plan with the calibrated cost
        calibration.start(control.replanner.request)
    metrics_port = None if settings.metrics.port is None else serve_metrics(metrics.registry, settings.metrics).port
    log.info(
        "trainer %s: control plane on %s, metrics on %s", kafka.resolved_instance_id(), control.target, metrics_port
    )
    return TrainerProcess(parts, control, planner, metrics_port, drift, models, hosts, calibration)


def run_trainer(settings: Settings, *, on_ready: Callable[[TrainerProcess], None] | None = None) -> int:
    """Run until SIGTERM/SIGINT: then drain, snapshot, commit and stop the control plane (exit 0)."""
    process = start_trainer(settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if on_ready is not None:
        on_ready(process)
    try:
        process.parts.stream.run(stop)
    finally:
        if process.drift is not None:
            process.drift.close()
        if process.calibration is not None:
            process.calibration.close()
        if process.models is not None:
            process.models.close(timeout_s=0.5)  # a frozen Redis must not hold the exit
        process.control.stop(grace_s=5)
        if process.hosts is not None:
            end_job(process.hosts)  # after the stream's drain closed the learner's last clock
    return 0
