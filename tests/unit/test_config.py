"""Settings: defaults, the example file, environment overrides with coercion, rejected keys, precise errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from ferret_core.errors import ConfigError
from services.config import (
    CONFIG_ENV,
    KafkaSettings,
    ProducerSettings,
    Settings,
    SettingsError,
    load_settings,
)
from services.units import ArrivalInterval

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "ferret.example.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ferret.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    settings = load_settings(env={})
    assert settings == Settings()
    assert settings.source is None
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.kafka.topic_prefix == "ferret"
    assert settings.kafka.session_timeout_ms == 6000
    assert settings.kafka.topics.samples == "ferret.samples"
    assert settings.trainer.method == "ferret"
    assert settings.trainer.compensator == "iter-fisher-lean"  # Iter-Fisher's accuracy at 20 % of its bytes
    assert settings.trainer.budget_bytes is None
    assert settings.trainer.arrival_interval == "measured"  # the stream's own rate (DESIGN §4)
    assert settings.trainer.stream_rate is None
    assert (settings.trainer.lr, settings.trainer.threads) == (1e-3, 1)
    assert settings.producer.rate is None and settings.producer.labels == "with-sample"
    assert settings.control.token is None and settings.metrics.port == 9100


def test_the_example_documents_every_key_with_its_default() -> None:
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    defaults = Settings().redacted()
    assert {s: set(keys) for s, keys in data.items()} == {s: set(keys) for s, keys in defaults.items()}
    loaded = load_settings(EXAMPLE, env={})
    assert dataclasses.replace(loaded, source=None) == Settings()


def test_file_then_environment_with_type_coercion(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "kafka:\n  bootstrap_servers: a:1\n  sample_partitions: 2\ntrainer:\n  lr: 1e-2\n  budget_bytes: 2GB\n",
    )
    env = {
        "FERRET_KAFKA_BOOTSTRAP_SERVERS": "b:2,c:3",
        "FERRET_KAFKA_SESSION_TIMEOUT_MS": "2_000",
        "FERRET_KAFKA_INSTANCE_ID": "trainer-0",
        "FERRET_KAFKA_PROPERTIES": '{"linger.ms": 10, "compression.type": zstd, "socket.nagle.disable": no}',
        "FERRET_TRAINER_BUDGET_BYTES": "512MiB",
        "FERRET_TRAINER_ARRIVAL_INTERVAL": "2x",
        "FERRET_TRAINER_DECAY": "0.25",
        "FERRET_TRAINER_MAX_WORKERS": "null",
        "FERRET_PRODUCER_RATE": "max",
        "FERRET_PRODUCER_LOOP": "yes",
        "FERRET_PRODUCER_SHUFFLE": "0",
        "FERRET_PRODUCER_DATA_ROOT": "~/data",
        "FERRET_METRICS_PORT": "none",
        "FERRET_FAILPOINT": "",  # read by services/failpoints.py, not a setting: allowed
        "OTHER": "x",
    }
    settings = load_settings(path, env=env)
    assert settings.source == path
    assert settings.kafka.bootstrap_servers == "b:2,c:3"  # the environment wins over the file
    assert settings.kafka.sample_partitions == 2  # the file wins over the default
    assert settings.kafka.session_timeout_ms == 2000
    assert settings.kafka.resolved_instance_id() == "trainer-0"
    assert settings.kafka.properties == {
        "linger.ms": "10",
        "compression.type": "zstd",
        "socket.nagle.disable": "false",
    }
    assert settings.trainer.lr == 0.01  # YAML 1.1 reads 1e-2 as a string
    assert settings.trainer.budget_bytes == 512 * 2**20
    assert settings.trainer.arrival_interval == ArrivalInterval(multiple=2.0)
    assert settings.trainer.decay == 0.25 and settings.trainer.max_workers is None
    assert settings.producer.rate is None and settings.producer.loop is True and settings.producer.shuffle is False
    assert settings.producer.data_root == Path.home() / "data"
    assert settings.metrics.port is None


def test_measured_arrival_and_seconds() -> None:
    assert load_settings(env={"FERRET_TRAINER_ARRIVAL_INTERVAL": "measured"}).trainer.arrival_interval == "measured"
    seconds = load_settings(env={"FERRET_TRAINER_ARRIVAL_INTERVAL": "0.005"}).trainer.arrival_interval
    assert seconds == ArrivalInterval(multiple=None, seconds=0.005)


def test_config_path_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "redis:\n  namespace: team-a\n  keep: 5\n")
    settings = load_settings(env={CONFIG_ENV: str(path)})
    assert (settings.redis.namespace, settings.redis.keep, settings.source) == ("team-a", 5, path)


def test_an_empty_file_and_empty_sections_give_the_defaults(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, ""), env={}).kafka == KafkaSettings()
    assert load_settings(write(tmp_path, "kafka:\nredis: {}\n"), env={}).kafka == KafkaSettings()


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("kafak:\n  group_id: x\n", ["kafak", "expected a section", "did you mean 'kafka'?"]),
        ("kafka:\n  sesion_timeout_ms: 3000\n", ["kafka.sesion_timeout_ms", "did you mean 'session_timeout_ms'?"]),
        ("trainer:\n  colour: red\n", ["trainer.colour", "a key of section trainer", "remove it"]),
        ("- a\n- b\n", ["a mapping of sections", "list"]),
        ("kafka: 3\n", ["kafka", "a mapping of keys"]),
    ],
)
def test_unknown_or_malformed_file_content_is_rejected(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as info:
        load_settings(path, env={})
    message = str(info.value)
    assert f"in {path}" in message
    for fragment in fragments:
        assert fragment in message


def test_an_unknown_environment_key_of_a_known_section_is_rejected() -> None:
    with pytest.raises(SettingsError, match=r"FERRET_KAFKA_BOOTSTRAP_SERVER\).*did you mean 'bootstrap_servers'"):
        load_settings(env={"FERRET_KAFKA_BOOTSTRAP_SERVER": "a:1"})


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("FERRET_REDSI_URL", "did you mean 'FERRET_REDIS_URL'?"),
        ("FERRET_KAFAK_GROUP_ID", "did you mean 'FERRET_KAFKA_GROUP_ID'?"),
        ("FERRET_FAILPOINTS", "did you mean 'FERRET_FAILPOINT'?"),
        ("FERRET_TRACE_RECORD", "did you mean 'FERRET_TRACE_RECORD_PATH'?"),
        ("FERRET_WIDGETS", "unset it (see config/ferret.example.yaml)"),
    ],
)
def test_an_unknown_ferret_variable_is_rejected_with_the_closest_known_name(name: str, hint: str) -> None:
    """A FERRET_* variable of no section that nothing reads is a typo until shown otherwise: the error names
    it, what was expected, and the closest variable Ferret knows; never its value (it may be a secret)."""
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={name: "s3cret-value", "FERRET_KAFKA_GROUP_ID": "g"})
    message = str(info.value)
    assert message.startswith(f"{name} (an environment variable): expected FERRET_<SECTION>_<KEY>"), message
    assert hint in message and "s3cret-value" not in message


def test_variables_read_besides_the_settings_are_allowed() -> None:
    """Every FERRET_* variable another part of Ferret reads is on the loader's list, so the settings load
    in an environment that sets them all."""
    from services import failpoints
    from services.cli import control_cmd
    from services.config.loader import OTHER_VARIABLES
    from services.trainer import path_trace

    read_elsewhere = {CONFIG_ENV, failpoints.ENV, path_trace.TRACE_ENV, control_cmd.TARGET_ENV}
    assert read_elsewhere <= set(OTHER_VARIABLES)
    env = {name: "" for name in OTHER_VARIABLES if name != CONFIG_ENV}
    assert load_settings(None, env={**env, "FERRET_REDIS_NAMESPACE": "n"}).redis.namespace == "n"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("FERRET_KAFKA_SESSION_TIMEOUT_MS", "abc", "expected an integer, got 'abc'"),
        ("FERRET_KAFKA_SESSION_TIMEOUT_MS", "10", "expected milliseconds in [1_000, 3_600_000], got 10"),
        ("FERRET_KAFKA_BOOTSTRAP_SERVERS", "localhost", "expected a comma-separated list of HOST:PORT"),
        ("FERRET_KAFKA_TOPIC_PREFIX", "a b", "expected 1-200 characters"),
        ("FERRET_KAFKA_SAMPLE_PARTITIONS", "0", "expected an integer in [1, 10_000], got 0"),
        ("FERRET_KAFKA_SECURITY_PROTOCOL", "TLS", "expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ("FERRET_KAFKA_PROPERTIES", "{group.id: x}", "remove ['group.id'] from kafka.properties"),
        ("FERRET_KAFKA_PROPERTIES", "[1, 2]", "expected a mapping of names to scalar values"),
        ("FERRET_REDIS_URL", "http://x", "expected a redis://, rediss:// or unix:// URL"),
        ("FERRET_TRAINER_MODEL", "resnet", "expected one of mlp, mnistnet, convnet, resnet18, mobilenet"),
        ("FERRET_TRAINER_DATASET", "imagenet", "expected one of digits, mnist"),
        ("FERRET_TRAINER_BUDGET_BYTES", "lots", "expected bytes as an integer or with a suffix"),
        ("FERRET_TRAINER_BUDGET_BYTES", "0", "expected bytes >= 1, got 0"),
        ("FERRET_TRAINER_ARRIVAL_INTERVAL", "soon", "expected 'auto' (= max_i t̂_i^f), 'Kx'"),
        ("FERRET_TRAINER_LR", "-1", "expected a learning rate"),
        ("FERRET_TRAINER_LR", "nan", "expected a number, got 'nan'"),
        ("FERRET_TRAINER_DEVICE", "gpu", "expected cpu, cuda, cuda:N or mps"),
        ("FERRET_TRAINER_THREADS", "1.5", "expected an integer, got '1.5'"),
        ("FERRET_TRAINER_PROFILE", "/no/such/profile.json", "expected the path of an existing file"),
        ("FERRET_PRODUCER_RATE", "-3", "expected a positive number of items per second, or 'max'"),
        ("FERRET_PRODUCER_LOOP", "maybe", "expected true or false, got 'maybe'"),
        ("FERRET_PRODUCER_LABELS", "later", "expected one of with-sample, delayed, none"),
        ("FERRET_CONTROL_LISTEN", "50051", "expected HOST:PORT to listen on"),
        ("FERRET_METRICS_PORT", "70000", "expected a TCP port in [0, 65_535], got 70000"),
    ],
)
def test_bad_values_give_precise_errors(name: str, value: str, expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(env={name: value})
    message = str(info.value)
    key = name.removeprefix("FERRET_").lower().replace("_", ".", 1)
    assert message.startswith(f"{key} (from {name}): ")
    assert expected in message
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)
    assert info.value.key == key


def test_bad_file_values_name_the_file_and_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "trainer:\n  threads: true\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path, env={})
    assert str(info.value) == (
        f"trainer.threads (in {path}): expected an integer, got True; correct trainer.threads in the YAML file "
        "or in FERRET_TRAINER_THREADS"
    )


def test_unreadable_or_invalid_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*No such file"):
        load_settings(tmp_path / "missing.yaml", env={})
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_settings(write(tmp_path, "kafka: [\n"), env={})


def test_cross_field_checks() -> None:
    with pytest.raises(SettingsError, match=r"kafka.sasl_mechanism: expected a SASL mechanism with .*SASL_SSL"):
        load_settings(env={"FERRET_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    with pytest.raises(SettingsError, match="a user name and a password with SASL PLAIN"):
        KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u")
    with pytest.raises(SettingsError, match=r"producer.loop \(from FERRET_PRODUCER_LOOP\)"):
        load_settings(env={"FERRET_PRODUCER_LOOP": "true", "FERRET_PRODUCER_ITEMS": "3"})


def test_the_snapshot_stall_bound_lies_below_the_redis_timeout() -> None:
    """``redis.stall_s`` must be below ``redis.timeout_s`` (health reports a hung write before Redis times it
    out); unset, it is min(1 s, timeout_s / 2)."""
    assert load_settings(env={}).redis.resolved_stall_s() == 1.0
    assert load_settings(env={"FERRET_REDIS_TIMEOUT_S": "0.5"}).redis.resolved_stall_s() == 0.25
    assert load_settings(env={"FERRET_REDIS_STALL_S": "2"}).redis.resolved_stall_s() == 2.0
    with pytest.raises(ConfigError, match=r"redis.stall_s \(from FERRET_REDIS_STALL_S\): expected seconds below "
                       r"redis.timeout_s \(5\)"):  # fmt: skip
        load_settings(env={"FERRET_REDIS_STALL_S": "5"})


def test_control_tls_needs_both_files(tmp_path: Path) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_text("pem")
    with pytest.raises(SettingsError, match="a certificate and its key together"):
        load_settings(env={"FERRET_CONTROL_TLS_CERT": str(cert)})
    settings = load_settings(env={"FERRET_CONTROL_TLS_CERT": str(cert), "FERRET_CONTROL_TLS_KEY": str(cert)})
    assert settings.control.tls_key == cert


def test_secrets_stay_out_of_reprs_and_messages() -> None:
    env = {
        "FERRET_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "FERRET_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "FERRET_KAFKA_SASL_USERNAME": "ferret",
        "FERRET_KAFKA_SASL_PASSWORD": "hunter2",
        "FERRET_CONTROL_TOKEN": "s3cret-token",
    }
    settings = load_settings(env=env)
    assert "hunter2" not in repr(settings) and "s3cret" not in repr(settings)
    assert settings.redacted()["kafka"]["sasl_password"] == "***"
    assert settings.redacted()["control"]["token"] == "***"
    config = settings.kafka.producer_config()
    assert config["sasl.password"] == "hunter2" and config["sasl.mechanism"] == "SCRAM-SHA-512"
    with pytest.raises(SettingsError) as info:
        dataclasses.replace(settings.kafka, sasl_password=12345)  # type: ignore[arg-type]
    assert "12345" not in str(info.value) and "***" in str(info.value)


def test_replace_validates_like_loading() -> None:
    producer = ProducerSettings()
    assert dataclasses.replace(producer, rate=250.0).rate == 250.0
    with pytest.raises(SettingsError, match=r"producer.burst: expected an integer >= 1, got 0"):
        dataclasses.replace(producer, burst=0)
    with pytest.raises(SettingsError, match=r"producer.labels: expected one of with-sample, delayed, none"):
        dataclasses.replace(producer, labels="sometimes")  # type: ignore[arg-type]


def test_client_configs() -> None:
    kafka = KafkaSettings(bootstrap_servers="k:9092", group_id="g", instance_id="t-0", properties={"linger.ms": "20"})
    producer = kafka.producer_config()
    assert producer["enable.idempotence"] is True and producer["acks"] == "all"
    assert producer["linger.ms"] == "20"  # properties win over Ferret's defaults
    consumer = kafka.consumer_config()
    assert consumer["group.id"] == "g" and "group.instance.id" not in consumer  # dynamic membership by default
    assert "partition.assignment.strategy" not in consumer  # librdkafka's eager range,roundrobin
    cooperative = {"partition.assignment.strategy": "cooperative-sticky"}
    assert dataclasses.replace(kafka, properties=cooperative).consumer_config()["partition.assignment.strategy"] == (
        "cooperative-sticky"
    )
    static = dataclasses.replace(kafka, static_membership=True).consumer_config()
    assert static["group.instance.id"] == "t-0"
    assert consumer["enable.auto.offset.store"] is False and consumer["session.timeout.ms"] == 6000
    assert consumer["bootstrap.servers"] == "k:9092" and "sasl.password" not in consumer


def test_client_variables_do_not_break_service_settings() -> None:
    """``ferret control`` reads FERRET_CONTROL_TARGET; ``ferret run`` in the same environment ignores it."""
    from services.config import load_settings

    settings = load_settings(None, env={"FERRET_CONTROL_TARGET": "10.0.0.1:50051", "FERRET_CONTROL_TOKEN": "t"})
    assert settings.control.token == "t"


def test_the_json_schema_in_docs_is_current_and_accepts_the_example() -> None:
    import json

    from services.config.schema import settings_schema

    committed = json.loads((Path(__file__).resolve().parents[2] / "docs" / "config.schema.json").read_text())
    assert committed == json.loads(json.dumps(settings_schema())), (
        "regenerate: .venv/bin/python -m services.config.schema > docs/config.schema.json"
    )
    sections = committed["properties"]
    assert set(sections) == set(Settings().redacted())
    for name, keys in Settings().redacted().items():
        assert set(sections[name]["properties"]) == set(keys)
    assert sections["control"]["properties"]["token"]["writeOnly"] is True
    assert sections["trainer"]["properties"]["input_normaliser"]["enum"] == ["none", "clip", "minmax"]
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    jsonschema.validate(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")), committed)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"kafka": {"bootstrap_server": "a:1"}}, committed)


def test_an_unknown_method_is_a_config_error_naming_every_method_of_the_registry() -> None:
    from ferret_core.engine import METHOD_NAMES

    with pytest.raises(SettingsError, match=r"trainer\.method") as info:
        load_settings(None, env={"FERRET_TRAINER_METHOD": "sgd"})
    assert all(name in str(info.value) for name in METHOD_NAMES)
    for name in METHOD_NAMES:
        assert load_settings(None, env={"FERRET_TRAINER_METHOD": name}).trainer.method == name
