"""The settings sections: frozen dataclasses that validate themselves in ``__post_init__`` (so
``dataclasses.replace`` with a CLI flag's value is checked like a value from the file)."""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_type_hints

from ferret_core.compensation import COMPENSATOR_NAMES, CompensatorSettings
from ferret_core.data import DATASET_NAMES
from ferret_core.engine import METHOD_NAMES
from ferret_core.errors import ConfigError
from ferret_core.zoo import MODEL_NAMES
from services.config.values import (
    SECRET,
    Invalid,
    Measured,
    SettingsError,
    between,
    check_bootstrap,
    check_device,
    check_file,
    check_host,
    check_listen,
    check_name,
    check_prefix,
    check_redis_url,
    default_fix,
    describe,
    has_type,
    is_secret_property,
    meta,
    one_of,
    parse_arrival,
    parse_budget,
    parse_range,
    parse_rate,
    redact_properties,
    redact_url,
    shown,
)
from services.kafka.admin import TopicNames
from services.kafka.record_codec import DEFAULT_INPUT_RANGE, Normaliser
from services.models import check_model_spec
from services.models import parse_shape as parse_shape_text
from services.units import ArrivalInterval

LabelMode = Literal["with-sample", "delayed", "none"]
Split = Literal["train", "test"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
# Which thread trains: "loop", the record path's own thread between consumer batches (CPU stages only);
# "executors", a thread per live (worker, stage); "auto": "loop" for a plan with one live executor on CPU, else
# "executors".
TrainingThread = Literal["auto", "loop", "executors"]
DriftDetectorName = Literal["adwin", "page-hinkley", "none"]
DriftReaction = Literal["none", "reset-compensator"]
ProbationRule = Literal["suspect", "always"]
# Which executors train: "processes", an OS process per live (worker, stage) over a master in shared memory;
# "threads", the wall clock's executor threads (and training_thread); "auto": processes where more than one
# executor pays (CPU, >= 2 cores, >= 1 ms per item by the profile, a method that runs there), else threads
# (services/trainer/executors.py, docs/service.md "Executors").
ExecutorKindSetting = Literal["auto", "threads", "processes"]
# Several hosts: "torchrun", every host runs `ferret run` under torchrun (c10d rendezvous); rank 0 is the trainer,
# the other ranks own its stages and their executor processes (ferret_core/planning/placement.py, docs/service.md
# "Several hosts"); "off": this host trains alone.
HostsSetting = Literal["off", "torchrun"]
PlannerObjective = Literal["rate", "accuracy"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"]

# librdkafka properties that have a named setting (or that Ferret's semantics fix): not in kafka.properties.
MANAGED_KAFKA_PROPERTIES = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "group.instance.id",
        "session.timeout.ms",
        "enable.idempotence",
        "enable.auto.offset.store",
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
    }
)


_BUDGET = "bytes as an integer or with a suffix (e.g. 2429288, 512MiB, 2GB), or null (unconstrained)"
_ARRIVAL = "'auto' (= max_i t̂_i^f), 'Kx' (e.g. 2x), a positive number of seconds, or 'measured'"
_RATE = "a positive number of items per second, or 'max'"
_STREAM_RATE = "a positive number of items per second this trainer receives, or null (not declared)"
_MODEL = f"one of {', '.join(MODEL_NAMES)}, or package.module:factory (docs/your-model.md)"
_SHAPE = "a per-sample input shape such as 1,28,28 or [1, 28, 28] (no batch dimension), or null (the dataset's)"


def check_model(value: str) -> None:
    try:
        check_model_spec(value)
    except ConfigError:
        raise Invalid(_MODEL) from None


def parse_shape(raw: Any) -> tuple[int, ...]:
    if isinstance(raw, (list, tuple)):
        raw = ",".join(str(v) for v in raw)
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise ValueError(raw)
    return parse_shape_text(str(raw))


COMPENSATOR_SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(CompensatorSettings))


def compensator_settings_from(values: dict[str, str]) -> CompensatorSettings:
    """``trainer.compensator_settings`` (names of :class:`CompensatorSettings` fields to numbers, as the
    config's mappings hold them: strings) as the settings every stage's compensator is built with; raises
    :class:`Invalid` naming the entry."""
    numbers: dict[str, float] = {}
    fix = "docs/compensation.md says what each setting does"
    for name, text in values.items():
        if name not in COMPENSATOR_SETTING_NAMES:
            raise Invalid(
                f"names of compensator settings ({', '.join(COMPENSATOR_SETTING_NAMES)})",
                fix,
                subkey=name,
                got=name,
            )
        try:
            numbers[name] = float(text)
        except ValueError:
            raise Invalid("a number (inf where a setting allows it)", fix, subkey=name, got=text) from None
    for name, number in numbers.items():  # one at a time, so the error names the entry
        try:
            CompensatorSettings(**{name: number})
        except ConfigError as exc:
            rule = str(exc).rsplit(", got ", 1)[0]
            raise Invalid(f"a value within its range ({rule})", fix, subkey=name, got=values[name]) from None
    return CompensatorSettings(**numbers)


def _check_compensator_settings(value: dict[str, str]) -> None:
    compensator_settings_from(value)


def _check_properties(value: dict[str, str]) -> None:
    managed = sorted(k for k in value if k in MANAGED_KAFKA_PROPERTIES)
    if managed:
        raise Invalid(
            "librdkafka properties other than the ones with a named setting",
            f"remove {managed} from kafka.properties and use the kafka.* settings of the same name",
        )
    for name, text in value.items():
        problem = librdkafka_rejects(name, text)
        if problem is not None:
            raise Invalid(
                f"a librdkafka property with a valid value (librdkafka: {problem})",
                "see CONFIGURATION.md of librdkafka for the property names and values",
                subkey=name,
                got=SECRET if is_secret_property(name) else text,
            )


def librdkafka_rejects(name: str, value: str) -> str | None:
    """Why librdkafka refuses ``name: value`` for both a producer and a consumer (None: accepted).
    Builds a client without brokers (no connection is made, ~0.3 ms each) so a bad property fails at
    start with one line rather than when the trainer creates its clients."""
    from confluent_kafka import Consumer, KafkaException, Producer

    for make, base in ((Producer, {}), (Consumer, {"group.id": "ferret-config-check"})):
        try:
            client = make({"log_level": 0, **base, name: value})
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            text = str(error.str() if hasattr(error, "str") else error).strip().splitlines()[0]
            return text.replace(value, SECRET) if is_secret_property(name) and value else text
        except (TypeError, ValueError) as exc:
            return str(exc).splitlines()[0]
        if make is Consumer:
            client.close()
    return None


def _check_key(value: str | None) -> None:
    if value is not None and len(value.encode("utf-8")) < 16:
        raise Invalid("a signing key of at least 16 bytes", "set FERRET_REDIS_HMAC_KEY to a long random string")


def _check_rate(value: float | None) -> None:
    if value is not None and not value > 0:
        raise Invalid(_RATE)


def _check_follow_share(value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise Invalid("a share of a thread's time in (0, 1]")


_check_follow_share.bounds = (0, 1)  # type: ignore[attr-defined]  # for the JSON Schema (0 itself is refused)


def _check_optional_listen(value: str | None) -> None:
    if value is not None:
        check_listen(value)


class Section:
    """Validation shared by the sections: every field's type (Literal choices included), then its check,
    then :meth:`_cross_check`."""

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            key = f"{self.section}.{f.name}"
            try:
                if not has_type(value, hints[f.name]):
                    raise Invalid(f.metadata.get("expected") or describe(hints[f.name]))
                check = f.metadata.get("check")
                if check is not None:
                    check(value)
            except Invalid as exc:
                secret = bool(f.metadata.get("secret"))
                got = exc.got if exc.subkey else shown(value, f.metadata)
                where = f"{key}.{exc.subkey}" if exc.subkey else key
                raise SettingsError(where, exc.expected, got, exc.fix or default_fix(key), secret=secret) from None
        self._cross_check()

    def _cross_check(self) -> None:
        """Checks between fields of a section (override)."""

    def _fail(self, name: str, expected: str, fix: str) -> SettingsError:
        return SettingsError(f"{self.section}.{name}", expected, getattr(self, name), fix)


@dataclass(frozen=True)
class KafkaSettings(Section):
    """Broker, topics, consumer group and security. ``security_protocol``, ``sasl_*`` and ``ssl_*`` are
    the librdkafka properties of the same name with dots; ``properties`` passes any other one through."""

    section = "kafka"
    bootstrap_servers: str = field(default="127.0.0.1:9092", metadata=meta(check=check_bootstrap))
    topic_prefix: str = field(default="ferret", metadata=meta(check=check_prefix))
    sample_partitions: int = field(default=1, metadata=meta(check=between(1, 10_000, "an integer")))
    group_id: str = field(default="ferret-trainer", metadata=meta(check=check_name))
    instance_id: str | None = field(default=None, metadata=meta(check=check_name))
    session_timeout_ms: int = field(default=6000, metadata=meta(check=between(1000, 3_600_000, "milliseconds")))
    # group.instance.id = the instance id (static membership): on Apache Kafka a restarted replica takes its
    # partitions back without a rebalance (docker-compose.yml and k8s/ turn it on). Off by default: on the
    # shipped local broker (Tansu) a killed static member's partitions never went to the survivors and the
    # group stayed stuck after it came back, and every join of a static member costs a fixed 6 s
    # (docs/reliability.md "Replicas").
    static_membership: bool = False
    # Readiness goes NOT_SERVING once this replica has owned no sample partition for this long (e.g. more
    # replicas than partitions, or a group stuck in a rebalance); SERVING again at its next assignment.
    unassigned_readiness_s: float = field(default=30.0, metadata=meta(check=between(0.1, 86_400, "seconds")))
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, metadata=meta(secret=True), repr=False)
    ssl_ca_location: Path | None = field(default=None, metadata=meta(check=check_file))
    ssl_certificate_location: Path | None = field(default=None, metadata=meta(check=check_file))
    ssl_key_location: Path | None = field(default=None, metadata=meta(check=check_file))
    ssl_key_password: str | None = field(default=None, metadata=meta(secret=True), repr=False)
    properties: dict[str, str] = field(
        default_factory=dict, metadata=meta(check=_check_properties, redact=redact_properties)
    )

    def _cross_check(self) -> None:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism is None:
            raise self._fail(
                "sasl_mechanism",
                f"a SASL mechanism with security_protocol {self.security_protocol}",
                "set kafka.sasl_mechanism (e.g. PLAIN, SCRAM-SHA-512)",
            )
        needs_password = self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
        if sasl and needs_password and (self.sasl_username is None or self.sasl_password is None):
            raise self._fail(
                "sasl_username",
                f"a user name and a password with SASL {self.sasl_mechanism}",
                "set kafka.sasl_username and kafka.sasl_password (e.g. FERRET_KAFKA_SASL_PASSWORD from a secret)",
            )
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise self._fail(
                "ssl_key_location",
                "a client certificate and its key together, or neither",
                "set both kafka.ssl_certificate_location and kafka.ssl_key_location, or remove both",
            )

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    def resolved_instance_id(self) -> str:
        """``instance_id``, else the host name (a StatefulSet pod's name is stable across restarts)."""
        return self.instance_id or socket.gethostname()

    def client_config(self) -> dict[str, Any]:
        """What every client needs: bootstrap servers, security, then ``properties``."""
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password,
        }
        config.update({k: str(v) for k, v in optional.items() if v is not None})
        config.update(self.properties)
        return config

    def producer_config(self) -> dict[str, Any]:
        """An idempotent producer (acks=all) with the Java client's key partitioner (murmur2), so a label
        keyed by its sample id lands on the partition index of its sample."""
        config = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random", "linger.ms": 5}
        return {**config, **self.client_config()}

    def consumer_config(self) -> dict[str, Any]:
        """The trainer's consumer: offsets stored only explicitly (DESIGN §4); static membership if on."""
        config: dict[str, Any] = {
            "group.id": self.group_id,
            "session.timeout.ms": self.session_timeout_ms,
            # librdkafka's 3000 ms default would outlast a short session: a third of it, as Kafka advises
            "heartbeat.interval.ms": min(3000, max(100, self.session_timeout_ms // 3)),
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
        }
        # Eager rebalancing (librdkafka's range,roundrobin): every join, expiry or rejoin pauses every partition
        # ~3 s on Tansu. kafka.properties may set "partition.assignment.strategy: cooperative-sticky" (only
        # what moves pauses; the callbacks handle it) on Apache Kafka: on Tansu a restarted third replica got
        # no partition back (docs/reliability.md "Replicas"). The two protocols do not mix in one group.
        if self.static_membership:
            config["group.instance.id"] = self.resolved_instance_id()
        return {**config, **self.client_config()}


@dataclass(frozen=True)
class RedisSettings(Section):
    """The snapshot store (DESIGN §4 "Redis snapshot layout")."""

    section = "redis"
    url: str = field(default="redis://127.0.0.1:6379/0", metadata=meta(check=check_redis_url, redact=redact_url))
    namespace: str = field(default="ferret", metadata=meta(check=check_name))
    snapshot_interval_s: float = field(default=60.0, metadata=meta(check=between(0, None, "seconds (0 = off)")))
    keep: int = field(default=3, metadata=meta(check=between(1, None, "an integer")))
    # Sign snapshot manifests (HMAC-SHA256) and accept only signed ones; >= 16 bytes. Prefer the env var.
    # A trainer needs it unless allow_unsigned is true (services/snapshots/signing.py).
    hmac_key: str | None = field(default=None, metadata=meta(secret=True, check=_check_key), repr=False)
    # Start a trainer without hmac_key, its snapshots unsigned (a warning at start). Ignored with a key.
    allow_unsigned: bool = False
    # Every Redis command fails after this many seconds (a frozen Redis cannot stall a snapshot longer).
    timeout_s: float = field(default=5.0, metadata=meta(check=between(0.1, 3600, "seconds")))
    # Snapshots are optional: a Redis that refuses the credentials at start-up degrades them (logged) instead
    # of failing the start. An unreachable Redis degrades them either way (retried with backoff).
    optional: bool = False
    # How long a snapshot may hold the record path (drain, flush, encode: readiness NOT_SERVING beyond) and a
    # Redis write may hang on its own thread (ferret.snapshots NOT_SERVING beyond) before health says so;
    # below timeout_s, so health reports a stuck write before Redis times it out. null: min(1 s, timeout_s / 2).
    stall_s: float | None = field(default=None, metadata=meta(check=between(0.01, 3600, "seconds")))

    def _cross_check(self) -> None:
        if self.stall_s is not None and self.stall_s >= self.timeout_s:
            raise self._fail(
                "stall_s",
                f"seconds below redis.timeout_s ({self.timeout_s:g}): health must report a stuck write before "
                "Redis times it out",
                "lower redis.stall_s, raise redis.timeout_s, or leave stall_s unset (min(1 s, timeout_s / 2))",
            )

    def resolved_stall_s(self) -> float:
        """``stall_s``, else min(1 s, ``timeout_s`` / 2)."""
        return self.stall_s if self.stall_s is not None else min(1.0, self.timeout_s / 2)


@dataclass(frozen=True)
class TrainerSettings(Section):
    """What the trainer learns and how (the names of DESIGN §4)."""

    section = "trainer"
    dataset: str = field(default="mnist", metadata=meta(check=one_of(DATASET_NAMES)))
    model: str = field(default="mnistnet", metadata=meta(check=check_model, expected=_MODEL))
    input_shape: tuple[int, ...] | None = field(default=None, metadata=meta(parse=parse_shape, expected=_SHAPE))
    num_classes: int | None = field(default=None, metadata=meta(check=between(1, None, "an integer")))
    weights: Path | None = field(default=None, metadata=meta(check=check_file))
    method: str = field(default="ferret", metadata=meta(check=one_of(METHOD_NAMES)))
    compensator: str = field(default="iter-fisher-lean", metadata=meta(check=one_of(COMPENSATOR_NAMES)))
    # The compensator's hyper-parameters that differ from the defaults (CompensatorSettings' fields, e.g.
    # dc_lambda0: DC-ASGD-a's correction is ≈ dc_lambda0·lr·|g| per element, so dc_lambda0 goes with lr).
    compensator_settings: dict[str, str] = field(
        default_factory=dict, metadata=meta(check=_check_compensator_settings)
    )
    budget_bytes: int | None = field(
        default=None, metadata=meta(parse=parse_budget, expected=_BUDGET, check=between(1, None, "bytes"))
    )
    # The stream's own rate by default: declared (stream_rate, a record's ferret.rate header), then measured.
    arrival_interval: ArrivalInterval | Measured = field(
        default="measured", metadata=meta(parse=parse_arrival, expected=_ARRIVAL)
    )
    stream_rate: float | None = field(
        default=None, metadata=meta(parse=parse_rate, expected=_STREAM_RATE, check=_check_rate)
    )
    arrival_drift_ratio: float = field(default=1.5, metadata=meta(check=between(1.0, None, "a ratio")))
    # With arrival_interval: measured, time a few training steps and one stale gradient's compensation at
    # start-up and plan the first stream in this machine's time, compensation counted (services/trainer/
    # calibration.py, docs/planner.md readings 11 and 14). Off by default: on the 16-core GPU host, before the
    # compensation was counted, it planned 2 workers that trained fewer items than 1 (benchmarks/live/README.md
    # "16-core host"); with it counted it has not been measured live.
    calibrate_time: bool = False
    # What the planner maximises: "rate" (R_F, the paper's) or "accuracy" (R_F discounted by the measured cost
    # of staleness, docs/planner.md reading 13). The cost: staleness_cost, the JSON `ferret simulate
    # --objective accuracy` calibrates and caches (under --cache-dir/staleness/) for this model, lr and stream;
    # unset, the trainer calibrates it on the first calibration_items labelled items it receives (in a child
    # process, calibration_seeds initialisations; planning by R_F until then: services/trainer/staleness_live.py).
    objective: PlannerObjective = "rate"
    staleness_cost: Path | None = field(default=None, metadata=meta(check=check_file))
    calibration_items: int = field(default=250, metadata=meta(check=between(18, 100_000, "a number of items")))
    calibration_seeds: int = field(default=3, metadata=meta(check=between(1, 10, "a number of seeds")))
    decay: float | None = field(default=None, metadata=meta(check=between(0, None, "a decay constant")))
    lr: float = field(default=1e-3, metadata=meta(check=between(1e-12, None, "a learning rate")))
    device: str = field(default="cpu", metadata=meta(check=check_device))
    threads: int = field(default=1, metadata=meta(check=between(1, 1024, "an integer")))
    # The trainer and its executor processes keep freed tensor memory in their heap (glibc's mallopt,
    # ferret_core/engine/heap.py): no page faults for the same megabytes every item (2 MNISTNet worker processes
    # with a compensator trained 1.09-1.41x the items/s); the processes keep their peak resident set.
    # false: glibc's defaults. No effect where the C library is not glibc.
    retain_freed_memory: bool = True
    # On executor processes, the trainer's own threads (the record path: consume, decode, predict, publish) run
    # this much below its executors' priority (a nice increment, 0-19; 0: the same priority), so where the
    # machine has no core to spare training runs first: on the 2-core demo at 1.5x saturation +16 % items trained
    # and +2.1 points of online accuracy at nice 10; past saturation the record path's backlog grows faster
    # (services/trainer/priority.py). No effect on thread executors.
    record_path_nice: int = field(default=10, metadata=meta(check=between(0, 19, "a nice increment")))
    # "loop" trains on the record path's thread between consumer batches: no GIL hand-overs between two Python
    # threads (digits/MLP at half the plain loop's saturation: 88 % of the items trained against 57 % on an
    # executor thread, docs/service.md "Which thread trains"); a prediction waits for at most the one training
    # action running when its record arrives.
    training_thread: TrainingThread = "auto"
    executors: ExecutorKindSetting = "auto"
    max_workers: int | None = field(default=None, metadata=meta(check=between(1, None, "an integer")))
    max_stages: int | None = field(default=None, metadata=meta(check=between(1, None, "an integer")))
    hosts: HostsSetting = "off"
    # With hosts: the most of each serving host's follower thread's time spent sending its stages' newest
    # masters to the trainer, whose predictions read those copies (ferret_core/engine/processes/follow.py):
    # 1 sends again as soon as a send ends (the freshest predictions, the most CPU on both ends).
    follow_share: float = field(default=0.25, metadata=meta(check=_check_follow_share))
    # With hosts: every host's own memory budget (each host's planned bytes, the stages it owns or, on rank 0,
    # the record path and its follower copies of the others' stages, stay within it; budget_bytes stays the
    # job's total); null: none (the plan still reports its bytes per host).
    host_budget_bytes: int | None = field(
        default=None, metadata=meta(parse=parse_budget, expected=_BUDGET, check=between(1, None, "bytes"))
    )
    profile: Path | None = field(default=None, metadata=meta(check=check_file))
    label_window: int = field(default=10_000, metadata=meta(check=between(0, None, "a number of items")))
    # The input contract's finite range (after uint8 → [0, 1]); values outside are rejected (out_of_range)
    # unless input_normaliser clips them (clip) or rescales each sample into the range (minmax).
    input_range: tuple[float, float] = field(
        default=DEFAULT_INPUT_RANGE, metadata=meta(parse=parse_range, expected="[low, high], finite, low < high")
    )
    input_normaliser: Normaliser = "none"
    # How many of the most probable classes (with their probabilities) every Prediction carries; 0: none.
    prediction_top_k: int = field(default=3, metadata=meta(check=between(0, 1000, "a number of classes")))
    # A record the trainer stopped on this many times (a poison record: its learner or producer failure
    # ends the process) is dead-lettered with the exception's text at its next arrival (reason poison).
    max_record_failures: int = field(default=3, metadata=meta(check=between(1, 1000, "an integer")))
    # Publish the master's full weights to the model stream (Redis, <redis.namespace>:models:{<instance>})
    # this often for `ferret serve` to follow; 0 turns it off (docs/serving.md).
    models_interval_s: float = field(default=1.0, metadata=meta(check=between(0, None, "seconds (0 = off)")))
    # Updates the model stream keeps (a follower needs only the newest; older ones are trimmed).
    models_keep: int = field(default=3, metadata=meta(check=between(1, 1000, "an integer")))

    def _cross_check(self) -> None:
        if self.executors == "processes" and self.device != "cpu":
            raise self._fail(
                "executors",
                f"'auto' or 'threads' with trainer.device {self.device!r} (process executors run CPU stages only)",
                "set trainer.executors: auto (or threads), or trainer.device: cpu",
            )
        if self.hosts != "off" and (self.executors == "threads" or self.device != "cpu"):
            raise self._fail(
                "hosts",
                f"'off' with trainer.executors {self.executors!r} and trainer.device {self.device!r} (the stages of "
                "other hosts run on CPU executor processes)",
                "set trainer.executors: auto (or processes) and trainer.device: cpu, or trainer.hosts: off",
            )
        if self.host_budget_bytes is not None and self.hosts == "off":
            raise self._fail(
                "host_budget_bytes",
                "null with trainer.hosts 'off' (one host's budget is trainer.budget_bytes)",
                "set trainer.budget_bytes instead, or trainer.hosts: torchrun",
            )
        if self.training_thread == "loop" and self.device != "cpu":
            raise self._fail(
                "training_thread",
                f"'auto' or 'executors' with trainer.device {self.device!r} (the loop trains CPU stages only)",
                "set trainer.training_thread: auto (or executors), or trainer.device: cpu",
            )

    def compensator_config(self) -> CompensatorSettings:
        """The settings every stage's compensator is built with (the defaults, changed by
        :attr:`compensator_settings`)."""
        return compensator_settings_from(self.compensator_settings)


@dataclass(frozen=True)
class ProducerSettings(Section):
    """``ferret produce``: which stream, how fast, and where the labels go (its flags override these)."""

    section = "producer"
    dataset: str = field(default="mnist", metadata=meta(check=one_of(DATASET_NAMES)))
    data_root: Path | None = None
    split: Split = "train"
    stream: str | None = field(default=None, metadata=meta(check=check_name))
    rate: float | None = field(default=None, metadata=meta(parse=parse_rate, expected=_RATE, check=_check_rate))
    burst: int = field(default=1, metadata=meta(check=between(1, None, "an integer")))
    items: int | None = field(default=None, metadata=meta(check=between(0, None, "an integer")))
    loop: bool = False
    labels: LabelMode = "with-sample"
    label_delay_s: float = field(default=1.0, metadata=meta(check=between(0, 86_400, "seconds")))
    seed: int = 0
    shuffle: bool = False
    flush_timeout_s: float = field(default=30.0, metadata=meta(check=between(0, None, "seconds")))

    def _cross_check(self) -> None:
        if self.loop and self.items is not None:
            raise self._fail("loop", "loop=false when items is set (one or the other)", "unset producer.items or loop")


@dataclass(frozen=True)
class ControlSettings(Section):
    """The gRPC control plane: ``token`` turns bearer-token auth on, ``tls_cert`` + ``tls_key`` TLS."""

    section = "control"
    listen: str = field(default="127.0.0.1:50051", metadata=meta(check=check_listen))
    token: str | None = field(default=None, metadata=meta(secret=True), repr=False)
    tls_cert: Path | None = field(default=None, metadata=meta(check=check_file))
    tls_key: Path | None = field(default=None, metadata=meta(check=check_file))
    # Accept unauthenticated clients on an address beyond loopback (logged as a warning at start);
    # without it (or a token) the trainer refuses to bind beyond loopback (services.exposure).
    insecure: bool = False
    # HOST:PORT serving grpc.health.v1 alone, without the token (the kubelet's probes); null: none.
    health_listen: str | None = field(default=None, metadata=meta(check=_check_optional_listen))

    def _cross_check(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise self._fail(
                "tls_key",
                "a certificate and its key together, or neither",
                "set both control.tls_cert and control.tls_key, or remove both",
            )


@dataclass(frozen=True)
class ServingSettings(Section):
    """``ferret serve``: the gRPC ``ferret.v1.Serving`` port, with the control plane's token and TLS options
    applied the same way (its own values, so serving and training can be exposed apart)."""

    section = "serving"
    listen: str = field(default="127.0.0.1:50061", metadata=meta(check=check_listen))
    token: str | None = field(default=None, metadata=meta(secret=True), repr=False)
    tls_cert: Path | None = field(default=None, metadata=meta(check=check_file))
    tls_key: Path | None = field(default=None, metadata=meta(check=check_file))
    insecure: bool = False
    health_listen: str | None = field(default=None, metadata=meta(check=_check_optional_listen))
    # Which trainer replica's model stream to follow; null: kafka.instance_id (resolved as the trainer does).
    instance_id: str | None = field(default=None, metadata=meta(check=check_name))
    # The largest batch one Predict may carry (bigger: INVALID_ARGUMENT).
    max_batch: int = field(default=1024, metadata=meta(check=between(1, 1_000_000, "an integer")))

    def _cross_check(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise self._fail(
                "tls_key",
                "a certificate and its key together, or neither",
                "set both serving.tls_cert and serving.tls_key, or remove both",
            )


@dataclass(frozen=True)
class MetricsSettings(Section):
    """The Prometheus endpoint; ``port: null`` turns it off, 0 picks a free port."""

    section = "metrics"
    port: int | None = field(default=9100, metadata=meta(check=between(0, 65535, "a TCP port")))
    addr: str = field(default="127.0.0.1", metadata=meta(check=check_host))
    # Bearer token the scraper must send (Prometheus: authorization.credentials); null: none.
    token: str | None = field(default=None, metadata=meta(secret=True), repr=False)
    # Serve unauthenticated metrics on an address beyond loopback (logged as a warning at start).
    insecure: bool = False


@dataclass(frozen=True)
class GuardSettings(Section):
    """Guarded updates and drift detection (docs/reliability.md "Guarded updates", "Drift")."""

    section = "guard"
    # A last-good copy of the model (the shadow) predicts the labelled items beside the live model; the live
    # model is rolled back to it when a CUSUM of the discordant pairs says it is worse (services/trainer/guard).
    enabled: bool = True
    # Norm guard: one SGD step changes a stage's weights by at most this share of their norm (floor 1); null: off.
    max_step_ratio: float | None = field(default=0.1, metadata=meta(check=between(1e-9, 10.0, "a ratio")))
    # Under equal models, at most one rollback per 1/false_alarm discordant pairs on average (CUSUM threshold
    # h = ln(1/false_alarm), Lorden's bound).
    false_alarm: float = field(default=1e-4, metadata=meta(check=between(1e-12, 0.5, "a probability")))
    # The alternative the test is tuned for: the shadow right on this share of the items where the two disagree.
    worse_share: float = field(default=0.75, metadata=meta(check=between(0.51, 0.999, "a share")))
    # ... and only when the live model is materially worse: the shadow's accuracy above the live model's by at
    # least this share over the items of the test's run (SGD noise while a model learns is not a rollback;
    # 0.25 from benchmarks/guard/results/false_alarms_seed*.md: clean streams' false alarms led by 8–26 points).
    min_drop: float = field(default=0.25, metadata=meta(check=between(0.0, 0.99, "a share")))
    # Labelled items the shadow predicts per promotion window; the live model becomes last-good one window late.
    window: int = field(default=200, metadata=meta(check=between(10, None, "a number of items")))
    # Compared items a passing window's weights wait, with the test never firing, before they become last-good
    # (promotion on probation: a temporary label flip is rolled back to the weights from before it); 0: at once.
    probation_items: int = field(default=500, metadata=meta(check=between(0, None, "a number of items")))
    # Which passing windows wait on probation: "suspect" ones (the shadow's accuracy fell during them or has not
    # come back: a burst or a drift may be under way; the others are promoted at once), or "always".
    probation: ProbationRule = "suspect"
    # A burst that ended: when the shadow's accuracy fell and came back (ADWIN on its correctness), the live model
    # is rolled back if the shadow beats it since the return (Wald's SPRT at this level); 0: off.
    recurrence_level: float = field(default=0.01, metadata=meta(check=between(0.0, 0.5, "a probability")))
    # ... and at the return itself, the live model and the weights from before the fall both predict this many
    # labelled items kept from before the fall (the recall test, same SPRT): rolled back at once if those win;
    # 0: off. Keeps up to twice this many inputs in memory.
    recall_items: int = field(default=256, metadata=meta(check=between(0, None, "a number of items")))
    # The shadow predicts every k-th labelled item (1: all of them).
    shadow_every: int = field(default=1, metadata=meta(check=between(1, None, "an integer")))
    # River drift detector on the correctness (labelled items) and the confidence (unlabelled ones).
    drift_detector: DriftDetectorName = "adwin"
    # What a detected drift does beyond the event: nothing, or reset the compensators' state (λ).
    drift_reaction: DriftReaction = "none"


SECTIONS: dict[str, type[Section]] = {
    "kafka": KafkaSettings,
    "redis": RedisSettings,
    "trainer": TrainerSettings,
    "producer": ProducerSettings,
    "control": ControlSettings,
    "serving": ServingSettings,
    "metrics": MetricsSettings,
    "guard": GuardSettings,
}


@dataclass(frozen=True)
class Settings:
    """Everything a service reads at start; ``source`` is the YAML file (None when there was none)."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    producer: ProducerSettings = field(default_factory=ProducerSettings)
    control: ControlSettings = field(default_factory=ControlSettings)
    serving: ServingSettings = field(default_factory=ServingSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    guard: GuardSettings = field(default_factory=GuardSettings)
    source: Path | None = None

    def redacted(self) -> dict[str, dict[str, Any]]:
        """Plain values per section (for logs), secrets replaced by ``***``."""
        out: dict[str, dict[str, Any]] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            values: dict[str, Any] = {}
            for f in dataclasses.fields(section):
                value = getattr(section, f.name)
                if f.metadata.get("secret") and value is not None:
                    value = SECRET
                elif f.metadata.get("redact") is not None:
                    value = shown(value, f.metadata)
                elif isinstance(value, Path | ArrivalInterval):
                    value = str(value)
                values[f.name] = value
            out[name] = values
        return out
