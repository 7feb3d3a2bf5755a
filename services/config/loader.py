"""``load_settings``: defaults, then one YAML file, then ``FERRET_<SECTION>_<KEY>`` environment variables."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from ferret_core.errors import ConfigError
from services.config.sections import SECTIONS, Section, Settings
from services.config.values import (
    ENV_PREFIX,
    NULLS,
    Invalid,
    SettingsError,
    coerce,
    default_fix,
    describe,
    env_name,
    is_optional,
    shown,
)

CONFIG_ENV = "FERRET_CONFIG"  # the YAML file's path when load_settings is given none
EXAMPLE = "config/ferret.example.yaml"


# ``FERRET_*`` variables that name no setting but are read elsewhere, and by what. Every other one that
# names no setting is an error at load (a typo such as FERRET_REDSI_URL would otherwise be ignored).
OTHER_VARIABLES: dict[str, str] = {
    CONFIG_ENV: "the YAML file's path (load_settings)",
    "FERRET_CONTROL_TARGET": "ferret control's address (a client; it may share an environment with ferret run)",
    "FERRET_FAILPOINT": "test-only fault injection (services/failpoints.py)",
    "FERRET_SUPERVISOR_RESTARTS": "restarts so far, set by `ferret run --supervise` (services/supervisor.py)",
    "FERRET_TRACE_RECORD_PATH": "the record path's trace, a measurement aid (services/trainer/path_trace.py)",
    "FERRET_HYPOTHESIS_EXAMPLES": "examples per property test (tests/unit/test_schedules.py)",
    "FERRET_REGENERATE_FIXTURES": "rewrites the schedule tables' fixtures (tests/unit/test_schedule_tables.py)",
    "FERRET_IMAGE": "the image docker compose builds and runs (docker-compose.yml)",
    "FERRET_TORCH_INDEX": "the torch wheel index of the image build (docker-compose.yml)",
    "FERRET_EXTRAS": "the extras the image installs (Dockerfile build argument)",
}


def load_settings(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Settings:
    """The settings from the defaults, the YAML file ``path`` (else ``$FERRET_CONFIG``, else none) and
    the ``FERRET_<SECTION>_<KEY>`` variables of ``env`` (default ``os.environ``), validated.

    Raises :class:`~services.config.values.SettingsError` (a ``ConfigError``) naming the key, its
    source, the expected and the received value and the fix; ``ConfigError`` when the file cannot be read.
    """
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_ENV):
        path = env[CONFIG_ENV]
    raw: dict[str, dict[str, tuple[Any, str]]] = {name: {} for name in SECTIONS}
    source = None if path is None else Path(path)
    if source is not None:
        for section, values in _read_yaml(source).items():
            raw[section].update({key: (value, f"in {source}") for key, value in values.items()})
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in OTHER_VARIABLES:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
        if section not in SECTIONS:
            raise _unknown_variable(name, section)
        _check_known(section, key, f"from {name}")
        raw[section][key] = (env[name], f"from {name}")
    sections = {name: build_section(cls, raw[name]) for name, cls in SECTIONS.items()}
    return Settings(**sections, source=source)  # type: ignore[arg-type]


def build_section(cls: type[Section], raw: Mapping[str, tuple[Any, str]]) -> Section:
    """A section from raw values, each with its source (``"in FILE"``, ``"from FERRET_X"``)."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, (value, source) in raw.items():
        name = f"{cls.section}.{key}"
        metadata = fields[key].metadata
        try:
            values[key] = _parse(value, hints[key], metadata)
        except Invalid as exc:
            fix = exc.fix or default_fix(name)
            got = shown(value, metadata)
            raise SettingsError(name, exc.expected, got, fix, source, secret=bool(metadata.get("secret"))) from None
    try:
        return cls(**values)
    except SettingsError as exc:
        origin = raw.get(exc.key.split(".")[1] if "." in exc.key else exc.key)
        raise (exc.with_source(origin[1]) if origin else exc) from None


def _parse(value: Any, tp: Any, metadata: Mapping[str, Any]) -> Any:
    parse = metadata.get("parse")
    if parse is None:
        return coerce(tp, value)
    if is_optional(tp) and (value is None or (isinstance(value, str) and value.strip().lower() in NULLS)):
        return None
    try:
        return parse(value)
    except (ValueError, TypeError, ConfigError):
        raise Invalid(metadata.get("expected") or describe(tp)) from None


def _read_yaml(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {str(path)!r}: {exc.strerror or exc}; pass an existing YAML file (see {EXAMPLE})"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    source = f"in {path}"
    if not isinstance(data, dict):
        sections = ", ".join(SECTIONS)
        raise SettingsError("(top level)", f"a mapping of sections ({sections})", type(data).__name__, "", source)
    out: dict[str, dict[str, Any]] = {}
    for section, values in data.items():
        if section not in SECTIONS:
            hint = _did_you_mean(str(section), list(SECTIONS)) or f"see {EXAMPLE}"
            raise SettingsError(str(section), f"a section ({', '.join(SECTIONS)})", section, hint, source)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise SettingsError(section, "a mapping of keys", type(values).__name__, f"see {EXAMPLE}", source)
        for key in values:
            _check_known(section, str(key), source)
        out[section] = {str(key): value for key, value in values.items()}
    return out


def _check_known(section: str, key: str, source: str) -> None:
    names = [f.name for f in dataclasses.fields(SECTIONS[section])]  # type: ignore[arg-type]
    if key not in names:
        raise SettingsError(
            f"{section}.{key}",
            f"a key of section {section} ({', '.join(names)})",
            key,
            _did_you_mean(key, names) or "remove it",
            source,
        )


def _unknown_variable(name: str, section: str) -> SettingsError:
    """A ``FERRET_*`` variable of no section that no part of Ferret reads: the closest known variable (the
    parts after ``FERRET_`` compared, so the shared prefix does not make every name look close)."""
    known = [env_name(f"{s}.{f.name}") for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    known += list(OTHER_VARIABLES)
    close = difflib.get_close_matches(name[len(ENV_PREFIX) :], [k[len(ENV_PREFIX) :] for k in known], n=1)
    hint = f"did you mean {ENV_PREFIX + close[0]!r}? Otherwise unset it" if close else f"unset it (see {EXAMPLE})"
    return SettingsError(
        name,
        f"{ENV_PREFIX}<SECTION>_<KEY> with a section of {', '.join(SECTIONS)}, or a variable Ferret reads "
        f"besides its settings ({', '.join(OTHER_VARIABLES)})",
        section,
        hint,
        "an environment variable",
    )


def _did_you_mean(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]!r}?" if close else ""
