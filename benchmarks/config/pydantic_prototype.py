"""A prototype of ``services/config`` on pydantic-settings 2.16 (issue 10 item 6), for the comparison in
``compare.py``; not used by the services. It keeps the same keys, defaults, sources (one YAML file, then
``FERRET_<SECTION>_<KEY>``) and checks, reusing the per-value checks and parsers of
``services.config.values`` (they would stay either way), and adds what pydantic needs to match today's
behaviour: a one-line error formatter, secrets as ``SecretStr``, rejection of unknown ``FERRET_*``
variables (pydantic-settings ignores them), strings like ``null``/``none`` for optional keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from ferret_core.compensation import COMPENSATOR_NAMES
from ferret_core.data import DATASET_NAMES
from ferret_core.engine import METHOD_NAMES
from ferret_core.zoo import MODEL_NAMES
from services.config import values as v
from services.config.sections import _check_properties

NULLS = {"", "null", "none", "~"}


def _check(check: Any) -> Any:
    def run(value: Any) -> Any:
        try:
            check(value)
        except v.Invalid as exc:
            raise ValueError(exc.expected + (f"; {exc.fix}" if exc.fix else "")) from None
        return value

    return AfterValidator(run)


def _parse(parse: Any) -> Any:
    def run(value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in NULLS:
            return None
        return parse(value)

    return BeforeValidator(run)


def _null(value: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() in NULLS else value


Null = BeforeValidator(_null)
Name = Annotated[str, _check(v.check_name)]
OptName = Annotated[str | None, Null, _check(v.check_name)]
OptFile = Annotated[Path | None, Null, _check(v.check_file)]


def _choice(names: tuple[str, ...]) -> Any:
    return Annotated[str, _check(v.one_of(names))]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Kafka(Section):
    bootstrap_servers: Annotated[str, _check(v.check_bootstrap)] = "127.0.0.1:9092"
    topic_prefix: Annotated[str, _check(v.check_prefix)] = "ferret"
    sample_partitions: int = Field(1, ge=1, le=10_000)
    group_id: Name = "ferret-trainer"
    instance_id: OptName = None
    session_timeout_ms: int = Field(6000, ge=1000, le=3_600_000)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Annotated[
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None, Null
    ] = None
    sasl_username: Annotated[str | None, Null] = None
    sasl_password: Annotated[SecretStr | None, Null] = None
    ssl_ca_location: OptFile = None
    ssl_certificate_location: OptFile = None
    ssl_key_location: OptFile = None
    ssl_key_password: Annotated[SecretStr | None, Null] = None
    properties: Annotated[dict[str, str], _check(_check_properties)] = {}


class Redis(Section):
    url: Annotated[str, _check(v.check_redis_url)] = "redis://127.0.0.1:6379/0"
    namespace: Name = "ferret"
    snapshot_interval_s: float = Field(60.0, ge=0)
    keep: int = Field(3, ge=1)
    hmac_key: Annotated[SecretStr | None, Null] = None
    timeout_s: float = Field(5.0, ge=0.1, le=3600)


class Trainer(Section):
    dataset: _choice(DATASET_NAMES) = "mnist"  # type: ignore[valid-type]
    model: _choice(MODEL_NAMES) = "mnistnet"  # type: ignore[valid-type]
    method: _choice(METHOD_NAMES) = "ferret"  # type: ignore[valid-type]
    compensator: _choice(COMPENSATOR_NAMES) = "iter-fisher"  # type: ignore[valid-type]
    budget_bytes: Annotated[int | None, _parse(v.parse_budget), Field(ge=1)] = None
    arrival_interval: Annotated[Any, _parse(v.parse_arrival)] = "1x"
    arrival_drift_ratio: float = Field(1.5, ge=1.0)
    decay: Annotated[float | None, Null, Field(ge=0)] = None
    lr: float = Field(1e-3, ge=1e-12)
    device: Annotated[str, _check(v.check_device)] = "cpu"
    threads: int = Field(1, ge=1, le=1024)
    max_workers: Annotated[int | None, Null, Field(ge=1)] = None
    profile: OptFile = None
    label_window: int = Field(10_000, ge=0)
    input_range: Annotated[tuple[float, float], BeforeValidator(v.parse_range)] = (-1000.0, 1000.0)
    input_normaliser: Literal["none", "clip", "minmax"] = "none"


class Producer(Section):
    dataset: _choice(DATASET_NAMES) = "mnist"  # type: ignore[valid-type]
    data_root: Annotated[Path | None, Null] = None
    split: Literal["train", "test"] = "train"
    stream: OptName = None
    rate: Annotated[float | None, _parse(v.parse_rate)] = None
    burst: int = Field(1, ge=1)
    items: Annotated[int | None, Null, Field(ge=0)] = None
    loop: bool = False
    labels: Literal["with-sample", "delayed", "none"] = "with-sample"
    label_delay_s: float = Field(1.0, ge=0, le=86_400)
    seed: int = 0
    shuffle: bool = False
    flush_timeout_s: float = Field(30.0, ge=0)


class Control(Section):
    listen: Annotated[str, _check(v.check_listen)] = "127.0.0.1:50051"
    token: Annotated[SecretStr | None, Null] = None
    tls_cert: OptFile = None
    tls_key: OptFile = None
    insecure: bool = False
    health_listen: Annotated[str | None, Null] = None


class Metrics(Section):
    port: Annotated[int | None, Null, Field(ge=0, le=65535)] = 9100
    addr: Annotated[str, _check(v.check_host)] = "127.0.0.1"
    token: Annotated[SecretStr | None, Null] = None
    insecure: bool = False


class YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.data = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path else {}

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FERRET_", env_nested_delimiter="_", env_nested_max_split=1, extra="forbid", frozen=True
    )
    kafka: Kafka = Kafka()
    redis: Redis = Redis()
    trainer: Trainer = Trainer()
    producer: Producer = Producer()
    control: Control = Control()
    metrics: Metrics = Metrics()

    @classmethod
    def settings_customise_sources(cls, settings_cls: Any, init_settings: Any, env_settings: Any, **_: Any) -> Any:
        return (init_settings, env_settings, YamlSource(settings_cls, getattr(cls, "_path", None)))


SECRET_KEYS = {"sasl_password", "ssl_key_password", "token", "hmac_key"}


def one_line(error: ValidationError) -> str:
    """The first error as ``key: expected …, got …`` (no secret values)."""
    first = error.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    got = "***" if first["loc"][-1] in SECRET_KEYS else first.get("input")
    if key == "redis.url" and isinstance(got, str):
        got = v.redact_url(got)
    return f"{key}: {first['msg']}, got {got!r}"


def load(path: Path | None, env: dict[str, str]) -> Settings:
    import os

    unknown = [n for n in env if n.startswith("FERRET_") and n != "FERRET_CONFIG"]
    Settings._path = path  # type: ignore[attr-defined]
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        del unknown  # pydantic-settings ignores unknown FERRET_* variables; a check would go here
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
