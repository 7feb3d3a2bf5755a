"""Shared parts of the service benchmarks (saturation, latency, overhead): a trainer started as its own
process (``ferret run``) against the embedded local stack, a paced MNIST producer, an independent reader of
the predictions topic, per-second samples of the trainer's status and of every process's CPU, and the
engine alone (no Kafka) under the same plan and settings as the service's learner.

Nothing here asserts performance: the scripts print and write what they measure.
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from ferret_core.data import Dataset, load_dataset
from services.config import ProducerSettings, Settings, load_settings
from services.config.data_root import default_data_root
from services.control.client import ControlClient
from services.localstack import LocalStack, free_port
from services.producer import ProduceReport, SampleProducer
from services.proto_gen.ferret.v1 import messages_pb2

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# The local broker (Tansu) does not answer a waiting fetch when records arrive: with librdkafka's default
# fetch.wait.max.ms (500) records reach a consumer 10-260 ms after they were produced (evenly spread; see
# latency.md). Since commit 37aa77e the trainer's consumer sets fetch.wait.max.ms 10 itself ("shipped");
# "fetch-500" puts librdkafka's default back through the supported kafka.properties setting (what the trainer
# did before). The shorter wait has a price on Tansu: its CPU per fetch grows with the records it holds, and
# the consumer fetches ~100 times a second (broker_effects.md).
KAFKA_CONFIGS: dict[str, dict[str, Any]] = {  # FERRET_KAFKA_PROPERTIES given to the trainer
    "shipped": {},
    "fetch-500": {"fetch.wait.max.ms": 500},
}
# what the trainer's consumer then uses, for baselines that mimic it (a Kafka hop, the arrival pattern)
CONSUMER_FETCH: dict[str, dict[str, Any]] = {
    "shipped": {"fetch.wait.max.ms": 10},
    "fetch-500": {"fetch.wait.max.ms": 500},
}
CONFIG_NOTES = {
    "shipped": "the trainer as committed: its consumer sets fetch.wait.max.ms 10 (since 37aa77e)",
    "fetch-500": "kafka.properties {fetch.wait.max.ms: 500}: librdkafka's default, the trainer before 37aa77e",
}
DISPATCHED = messages_pb2.TRAINING_DECISION_DISPATCHED
SKIPPED_BUSY = messages_pb2.TRAINING_DECISION_SKIPPED_BUSY


# -- machine -------------------------------------------------------------------------------------------
def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def git_head() -> str:
    """The commit the service code under test was at (plus ``+dirty`` when services/ has local changes)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "services", "ferret_core"], cwd=ROOT,
                               capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    return head.strip() + ("+dirty" if dirty.strip() else "")


def machine() -> dict[str, Any]:
    import torch

    return {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (0 when it is gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> dict[str, float]:
    """Machine-wide CPU seconds from /proc/stat: ``machine_busy`` (all but idle and iowait) and ``steal``
    (time the hypervisor gave to someone else: a noisy neighbour shows here, not in the load average)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    steal = fields[7] if len(fields) > 7 else 0
    return {"machine_busy": (sum(fields[:8]) - idle - steal) / tick, "steal": steal / tick}


def mnist() -> Dataset:
    return load_dataset("mnist", default_data_root())


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (nan for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(values: Sequence[float], suffix: str = "") -> dict[str, float]:
    """Count, p50/p90/p99 and max of ``values`` (keys ``p50{suffix}`` …; nan for no values)."""
    return {
        "n": len(values),
        f"p50{suffix}": quantile(values, 0.5),
        f"p90{suffix}": quantile(values, 0.9),
        f"p99{suffix}": quantile(values, 0.99),
        f"max{suffix}": max(values) if values else math.nan,
    }


def fmt(value: float, digits: int = 1) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


# -- predictions read back -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Pred:
    stream: str
    sequence: int
    latency_ms: float
    predicted_time_ms: int
    decision: int
    duplicate: bool
    received_ms: float  # wall clock (ms since the epoch) when this reader got the record


class PredictionReader:
    """An independent consumer of ``<prefix>.predictions``: a fresh group reading from the beginning
    (DESIGN §4 "Counting"), keeping the first prediction of every distinct sample id. ``properties`` are
    extra client properties; ``poll=True`` reads one record per ``poll`` (so ``received_ms`` is when the
    record reached this process) instead of batches."""

    def __init__(
        self, bootstrap: str, topic: str, properties: dict[str, Any] | None = None, poll: bool = False
    ) -> None:
        self._poll = poll
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-reader-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
                **(properties or {}),
            }
        )
        self._consumer.subscribe([topic])
        self._lock = threading.Lock()
        self._by_stream: dict[str, dict[int, Pred]] = {}
        self.records = 0
        self.duplicates = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-reader", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._poll:
                one = self._consumer.poll(0.2)
                messages = [] if one is None else [one]
            else:
                messages = self._consumer.consume(500, 0.2)
            received = time.time() * 1000
            for message in messages:
                if message.error():
                    continue
                p = messages_pb2.Prediction.FromString(message.value())
                with self._lock:
                    self.records += 1
                    seen = self._by_stream.setdefault(p.stream, {})
                    if p.sequence in seen:
                        self.duplicates += 1
                        continue
                    seen[p.sequence] = Pred(
                        p.stream, p.sequence, p.latency_ms, p.predicted_time_ms, p.decision, p.duplicate, received
                    )

    def count(self, stream: str) -> int:
        with self._lock:
            return len(self._by_stream.get(stream, {}))

    def get(self, stream: str) -> list[Pred]:
        with self._lock:
            return sorted(self._by_stream.get(stream, {}).values(), key=lambda p: p.sequence)

    def wait_for(self, stream: str, expected: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.count(stream) < expected:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def close(self) -> None:
        if self._stop.is_set():  # closed already
            return
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


# -- samples of the trainer's status and of CPU ------------------------------------------------------
@dataclass
class Sample:
    t: float  # monotonic
    status: dict[str, float]
    cpu: dict[str, float]  # cumulative CPU seconds per process


class Sampler:
    """Every ``interval`` s: GetStatus over gRPC (counters, lag_seconds) and the CPU seconds of the
    trainer, the broker and this process."""

    def __init__(self, client: ControlClient, pids: dict[str, int | None], interval: float = 1.0) -> None:
        self.client = client
        self.pids = pids
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()

    def take(self) -> Sample:
        s = self.client.get_status()
        status = {
            "items_valid": s.items_valid,
            "predictions_published": s.predictions_published,
            "items_dispatched": s.items_dispatched,
            "backward_passes": s.backward_passes,
            "busy": s.items_skipped.get("busy", 0),
            "lag_seconds": s.lag_seconds,
            "lag_items": s.lag_items,
            "pauses": s.pauses,
            "replans": s.replans,
            "measured_bytes": s.measured_bytes,
            "online_accuracy": s.online_accuracy,
            **self.more_status(s),
        }
        cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        cpu["benchmark"] = time.process_time()
        cpu.update(machine_cpu())
        return Sample(time.monotonic(), status, cpu)

    def more_status(self, status: Any) -> dict[str, float]:
        """What a benchmark samples besides (from the same GetStatus reply); nothing here."""
        return {}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.samples.append(self.take())
            except Exception:  # a missed sample is not a failure of the benchmark
                continue

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.t <= end]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def cpu_shares(samples: list[Sample]) -> dict[str, float]:
    """Cores used per process between the first and the last sample."""
    if len(samples) < 2:
        return {}
    a, b = samples[0], samples[-1]
    span = b.t - a.t
    return {k: round((b.cpu[k] - a.cpu[k]) / span, 3) for k in a.cpu}


# -- the trainer process ---------------------------------------------------------------------------------
@dataclass
class StartUp:
    """Readiness (health SERVING) and when the trainer really started consuming."""

    serving_s: float = math.nan  # process start → health SERVING
    first_prediction_after_serving_s: float = math.nan  # SERVING → first prediction published (status)


class Service:
    """The local stack plus ``ferret run`` as a separate process (``python -m services.cli.main run``),
    configured only through FERRET_* variables; producer settings for the same topics."""

    def __init__(
        self,
        model: str,
        *,
        kafka_properties: dict[str, Any] | None = None,
        budget_bytes: int | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.model = model
        self.kafka_properties = dict(kafka_properties or {})
        self.budget_bytes = budget_bytes
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="ferret-svc-bench-"))
        self.stack: LocalStack | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: ControlClient | None = None
        self.startup = StartUp()
        self.env: dict[str, str] = {}

    def trainer_env(self) -> dict[str, str]:
        assert self.stack is not None
        self.port = free_port()
        prefix = f"bench-{uuid.uuid4().hex[:6]}"
        env = {
            "FERRET_KAFKA_BOOTSTRAP_SERVERS": self.stack.bootstrap_servers,
            "FERRET_KAFKA_TOPIC_PREFIX": prefix,
            "FERRET_KAFKA_GROUP_ID": f"trainer-{prefix}",
            "FERRET_KAFKA_INSTANCE_ID": "replica-0",
            "FERRET_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "FERRET_KAFKA_SAMPLE_PARTITIONS": "1",
            "FERRET_REDIS_URL": self.stack.redis_url,
            "FERRET_REDIS_NAMESPACE": prefix,
            "FERRET_REDIS_SNAPSHOT_INTERVAL_S": "0",
            "FERRET_REDIS_HMAC_KEY": self.stack.snapshot_key,
            "FERRET_TRAINER_DATASET": "mnist",
            "FERRET_TRAINER_MODEL": self.model,
            "FERRET_TRAINER_PROFILE": str(ROOT / "benchmarks" / "profiles" / f"{self.model}.json"),
            "FERRET_CONTROL_LISTEN": f"127.0.0.1:{self.port}",
            "FERRET_METRICS_PORT": "null",
        }
        if self.kafka_properties:
            env["FERRET_KAFKA_PROPERTIES"] = json.dumps(self.kafka_properties)
        if self.budget_bytes is not None:
            env["FERRET_TRAINER_BUDGET_BYTES"] = str(self.budget_bytes)
        return env

    @property
    def settings(self) -> Settings:
        return load_settings(None, env=self.env)

    def __enter__(self) -> Service:
        self.stack = LocalStack().start()
        try:
            self.env = self.trainer_env()
            self.log_path = self.log_dir / f"trainer-{self.model}.log"
            self._log = self.log_path.open("ab")
            began = time.monotonic()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cli.main", "run", "--log-level", "WARNING"],
                env={**os.environ, **self.env},
                cwd=ROOT,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            self.client = ControlClient(f"127.0.0.1:{self.port}")
            deadline = began + 180
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"trainer exited: {self.log_path.read_text()[-3000:]}")
                try:
                    if self.client.health() == "SERVING":
                        break
                except Exception:  # not listening yet
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"trainer not SERVING after 180 s: {self.log_path.read_text()[-3000:]}")
                time.sleep(0.05)
            self.serving_at = time.monotonic()
            self.startup.serving_s = self.serving_at - began
            self.plan = json.loads(self.client.get_plan().plan_json)
        except BaseException:
            self.__exit__()
            raise
        return self

    @property
    def pids(self) -> dict[str, int | None]:
        assert self.stack is not None and self.proc is not None
        return {
            "trainer": self.proc.pid,
            "broker": self.stack.broker.pid if self.stack.broker else None,
            "redis": self.stack.redis_server.pid if self.stack.redis_server else None,
        }

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None) is not None:
            self._log.close()
        if self.stack is not None:
            self.stack.stop()

    def producer(self, dataset: Dataset, rate: float, items: int, stream: str) -> SampleProducer:
        options = ProducerSettings(rate=rate, items=items, stream=stream)
        return SampleProducer(dataset, self.settings.kafka, options, create_topics=False)

    def reader(self, *, low_latency: bool = False) -> PredictionReader:
        """``low_latency``: poll one record at a time with the service's own client properties."""
        settings = self.settings
        return PredictionReader(
            settings.kafka.bootstrap_servers,
            settings.kafka.topics.predictions,
            properties=self.kafka_properties if low_latency else None,
            poll=low_latency,
        )


# -- one paced stream and what became of it -------------------------------------------------------------
@dataclass
class StreamResult:
    """One producer stream (its own stream name, so ids are distinct) and its predictions read back."""

    stream: str
    rate: float
    seconds: float
    produced: int
    predicted: int
    complete: bool  # every produced item's prediction was read back before the wait ran out
    predicted_per_s: float
    trained_per_s: float  # predictions whose decision is DISPATCHED, per second of the stream
    busy_pct: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    q1_median_ms: float  # median latency of the first quarter of the stream (by sequence)
    q4_median_ms: float
    growth_ms_per_s: float  # least-squares slope of latency over the stream's event time
    max_lag_s: float  # the trainer's lag_seconds, max over the status samples of the window
    cpu: dict[str, float] = field(default_factory=dict)
    backward_passes_per_s: float = math.nan
    load_average: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(
    stream: str,
    rate: float,
    report: ProduceReport,
    preds: list[Pred],
    complete: bool,
    window: list[Sample],
    exclude_first_s: float = 0.0,
) -> StreamResult:
    """Statistics of ``preds``; the items whose event time lies in the first ``exclude_first_s`` seconds of
    the stream are left out of the latency and rate figures and reported on their own in ``extra``."""
    excluded: list[Pred] = []
    if preds and exclude_first_s > 0:
        origin = min(p.predicted_time_ms - p.latency_ms for p in preds)
        cut = origin + exclude_first_s * 1000
        excluded = [p for p in preds if p.predicted_time_ms - p.latency_ms < cut]
        preds = [p for p in preds if p.predicted_time_ms - p.latency_ms >= cut]
        seconds_kept = report.seconds - exclude_first_s
    else:
        seconds_kept = report.seconds
    lat = [p.latency_ms for p in preds]
    n = len(preds)
    seconds = seconds_kept
    quarter = max(1, n // 4)
    q1 = statistics.median(lat[:quarter]) if n else math.nan
    q4 = statistics.median(lat[-quarter:]) if n else math.nan
    # slope of latency against the sample's event time (= predicted_time - latency)
    if n >= 3:
        xs = [(p.predicted_time_ms - p.latency_ms) / 1000 for p in preds]
        mx, my = statistics.fmean(xs), statistics.fmean(lat)
        sxx = sum((x - mx) ** 2 for x in xs)
        growth = sum((x - mx) * (y - my) for x, y in zip(xs, lat, strict=True)) / sxx if sxx > 0 else math.nan
    else:
        growth = math.nan
    dispatched = sum(1 for p in preds if p.decision == DISPATCHED)
    busy = sum(1 for p in preds if p.decision == SKIPPED_BUSY)
    if n >= 2:
        span = (max(p.predicted_time_ms for p in preds) - min(p.predicted_time_ms for p in preds)) / 1000
        span = max(span, seconds * 0.5)
    else:
        span = seconds
    bps = math.nan
    if len(window) >= 2:
        bps = (window[-1].status["backward_passes"] - window[0].status["backward_passes"]) / (
            window[-1].t - window[0].t
        )
    return StreamResult(
        stream=stream,
        rate=rate,
        seconds=round(seconds, 2),
        produced=report.produced,
        predicted=n,
        complete=complete,
        predicted_per_s=n / span if span > 0 else math.nan,
        trained_per_s=dispatched / span if span > 0 else math.nan,
        busy_pct=100 * busy / n if n else math.nan,
        p50_ms=quantile(lat, 0.5),
        p99_ms=quantile(lat, 0.99),
        max_ms=max(lat) if lat else math.nan,
        q1_median_ms=q1,
        q4_median_ms=q4,
        growth_ms_per_s=growth,
        max_lag_s=max((s.status["lag_seconds"] for s in window), default=math.nan),
        cpu=cpu_shares(window),
        backward_passes_per_s=bps,
        load_average=load_average(),
        extra={
            "excluded_first_s": exclude_first_s,
            "excluded_items": len(excluded),
            "excluded_max_ms": max((p.latency_ms for p in excluded), default=math.nan),
            "excluded_p50_ms": quantile([p.latency_ms for p in excluded], 0.5),
        },
    )


def run_stream(
    service: Service,
    reader: PredictionReader,
    sampler: Sampler,
    dataset: Dataset,
    *,
    rate: float,
    seconds: float,
    stream: str,
    drain_timeout: float = 60.0,
    exclude_first_s: float = 0.0,
) -> StreamResult:
    """Produce ``rate`` items/s for ``seconds`` s as ``stream``, wait (up to ``drain_timeout``) for every
    prediction to be read back, and summarise."""
    items = max(1, round(rate * seconds))
    producer = service.producer(dataset, rate, items, stream)
    start = time.monotonic()
    report = producer.run()
    produced_end = time.monotonic()
    if not report.ok:
        raise RuntimeError(f"{stream}: {report.failure_reason()}")
    complete = reader.wait_for(stream, report.produced, drain_timeout)
    window = sampler.between(start, produced_end + 0.5)
    return summarise(stream, rate, report, reader.get(stream), complete, window, exclude_first_s)


@contextmanager
def running_service(
    model: str,
    *,
    kafka_properties: dict[str, Any] | None = None,
    budget_bytes: int | None = None,
    low_latency_reader: bool = False,
) -> Iterator[tuple[Service, PredictionReader, Sampler]]:
    with Service(model, kafka_properties=kafka_properties, budget_bytes=budget_bytes) as service:
        assert service.client is not None
        reader = service.reader(low_latency=low_latency_reader)
        sampler = Sampler(service.client, service.pids)
        try:
            yield service, reader, sampler
        finally:
            sampler.close()
            reader.close()


def warm_up(
    service: Service, reader: PredictionReader, sampler: Sampler, dataset: Dataset, rate: float, seconds: float
) -> StreamResult:
    """A stream sent right after SERVING (the consumer group may still be joining): it shows the
    start-up burst and leaves the trainer consuming before the measured streams."""
    result = run_stream(service, reader, sampler, dataset, rate=rate, seconds=seconds, stream="warmup")
    preds = reader.get("warmup")
    if preds:
        first = min(p.predicted_time_ms for p in preds) / 1000
        # serving_at is monotonic; convert with the offset between the clocks now
        offset = time.time() - time.monotonic()
        service.startup.first_prediction_after_serving_s = first - (service.serving_at + offset)
    return result


# -- the engine alone ------------------------------------------------------------------------------------
def engine_alone(
    model: str,
    dataset: Dataset,
    rate: float,
    seconds: float,
    budget_bytes: int | None = None,
    warmup_s: float = 0.0,
    burst_period_s: float = 0.0,
) -> dict:
    """The trainer's learner without Kafka: the same settings, planner, plan and engine options as
    ``services.trainer.runner.start_trainer`` + ``EngineLearner`` (torch threads, flush denormal, model,
    profile, Ferret plan for the budget, lr, compensator, measure_memory on, no trace), items submitted with
    ``WallClock.submit`` paced at ``rate`` on the wall clock in the stream's order (MNIST train from 0),
    each decoded from the same uint8 bytes as the service does. Prediction latency = prediction available −
    the item's due time (so a stall delays the items queued behind it too); ``predict_*`` leave out the items
    due in the first ``warmup_s`` seconds, ``predict_all_*`` keep them. ``burst_period_s`` > 0: the items of
    each period are submitted back to back at its end, as a consumer that receives a batch every period would
    (the same items per second, in bursts)."""
    import numpy as np
    import torch

    from ferret_core.data import normalise
    from services.trainer.engine_learner import EngineLearner
    from services.trainer.runner import build_zoo_model, load_profile, make_planner

    env = {
        "FERRET_TRAINER_DATASET": "mnist",
        "FERRET_TRAINER_MODEL": model,
        "FERRET_TRAINER_PROFILE": str(ROOT / "benchmarks" / "profiles" / f"{model}.json"),
    }
    if budget_bytes is not None:
        env["FERRET_TRAINER_BUDGET_BYTES"] = str(budget_bytes)
    settings = load_settings(None, env=env)
    torch.set_num_threads(settings.trainer.threads)
    torch.set_flush_denormal(True)
    zoo = build_zoo_model(settings)
    plan = make_planner(settings, load_profile(settings, zoo)).plan(settings.trainer.budget_bytes)
    # the service's own learner: the same StreamEngine, EngineSettings and started WallClock
    learner = EngineLearner(zoo, plan, settings)
    engine, clock = learner.engine, learner.clock
    x_all, y_all = dataset.x_train, dataset.y_train
    items = max(1, round(rate * (seconds + warmup_s)))
    latencies: list[float] = []
    warm_items = round(rate * warmup_s)
    skipped = 0
    machine0 = machine_cpu()
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        for i in range(items):
            due = t0 + (
                i / rate if burst_period_s <= 0 else (math.floor(i / rate / burst_period_s) + 1) * burst_period_s
            )
            clock.train_until(due)  # a 1 × 1 CPU plan trains on this thread (trainer.training_thread), as the loop does
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            row = i % len(y_all)
            x = normalise(np.frombuffer(bytearray(x_all[row].tobytes()), dtype=np.uint8).reshape(x_all[row].shape))
            # outcome(): predicts what is queued first (the service's clock predicts inline since issue 7 part G)
            arrival = clock.outcome(clock.submit(x, int(y_all[row]), index=i), 60)
            latencies.append((time.perf_counter() - due) * 1000)
            skipped += arrival.skipped is not None
        elapsed = time.perf_counter() - t0
        machine1 = machine_cpu()
        stats = engine.stats()
        admitted = stats.items - skipped
        trained_at_end = stats.trained_any_stage
        clock.drain(120)
    finally:
        learner.close()
    cpu = (time.process_time() - cpu0) / elapsed
    return {
        "rate": rate,
        "seconds": round(elapsed, 2),
        "items": items,
        "admitted": admitted,
        "admitted_per_s": admitted / elapsed,
        "busy_pct": 100 * stats.skipped.get("busy", 0) / items,
        "backward_passes_per_s": trained_at_end / elapsed,
        "predict_p50_ms": quantile(latencies[warm_items:], 0.5),
        "predict_p99_ms": quantile(latencies[warm_items:], 0.99),
        "predict_max_ms": max(latencies[warm_items:], default=math.nan),
        "predict_all_p50_ms": quantile(latencies, 0.5),
        "predict_all_p99_ms": quantile(latencies, 0.99),
        "predict_all_max_ms": max(latencies, default=math.nan),
        "warmup_s": warmup_s,
        "burst_period_s": burst_period_s,
        "cpu_cores": round(cpu, 3),
        "machine_cores": round((machine1.get("machine_busy", 0) - machine0.get("machine_busy", 0)) / elapsed, 3),
        "steal_cores": round((machine1.get("steal", 0) - machine0.get("steal", 0)) / elapsed, 3),
        "workers": plan.num_workers,
        "stages": plan.num_stages,
        "plan": json.loads(json.dumps(plan.to_dict())),
        "load_average": load_average(),
    }


def write_results(name: str, payload: dict[str, Any], markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    (RESULTS / f"{name}.md").write_text(markdown, encoding="utf-8")
