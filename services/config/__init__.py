"""The services' settings (DESIGN §4 "Config", STYLE 10): one frozen :class:`Settings` per service,
built from one YAML file plus ``FERRET_<SECTION>_<KEY>`` environment overrides and validated at start.

    settings = load_settings("ferret.yaml")      # None: $FERRET_CONFIG, else only defaults + environment
    settings.kafka.producer_config()             # librdkafka properties, security options included

Precedence, lowest first: the defaults of :mod:`services.config.sections`, the YAML file (sections
``kafka``, ``redis``, ``trainer``, ``producer``, ``control``, ``serving``, ``metrics``; ``config/ferret.example.yaml``
documents every key), then the environment (``FERRET_KAFKA_BOOTSTRAP_SERVERS``). Strings are coerced to
each key's type (``null``/``none``/empty → null for optional keys; ``true``/``false``/``yes``/``no``/
``on``/``off``/``1``/``0``; YAML or JSON mappings). Unknown sections and keys, in the file or as
``FERRET_*`` variables, are rejected with the closest known name; the variables read besides the
settings (``FERRET_CONFIG``, ``FERRET_FAILPOINT``, …) are the loader's ``OTHER_VARIABLES``. Every invalid value
raises :class:`SettingsError` (a ``ConfigError``, exit status 1 in the CLI) naming the key, its source,
expected vs got, and the fix; secrets (passwords, the control token) never appear in messages or reprs.
Sections validate in ``__post_init__``, so ``dataclasses.replace(settings.kafka, ...)`` with a CLI
flag's value is checked too.
"""

from services.config.loader import CONFIG_ENV, load_settings
from services.config.sections import (
    ControlSettings,
    KafkaSettings,
    LabelMode,
    MetricsSettings,
    ProducerSettings,
    RedisSettings,
    ServingSettings,
    Settings,
    TrainerSettings,
)
from services.config.values import SettingsError

__all__ = [
    "CONFIG_ENV",
    "ControlSettings",
    "KafkaSettings",
    "LabelMode",
    "MetricsSettings",
    "ProducerSettings",
    "RedisSettings",
    "ServingSettings",
    "Settings",
    "SettingsError",
    "TrainerSettings",
    "load_settings",
]
