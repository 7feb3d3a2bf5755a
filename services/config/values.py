"""Typed values of the settings: the error type, per-field checks and parsers, and the coercion of raw
YAML / environment values to a field's annotated type."""

from __future__ import annotations

import math
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from ferret_core.errors import ConfigError
from services.cli.args import ArrivalInterval, arrival_interval_type, parse_bytes
from services.kafka.admin import TopicNames

ENV_PREFIX = "FERRET_"
SECRET = "***"
NULLS = ("", "null", "none", "~")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")

Measured = Literal["measured"]
Check = Callable[[Any], None]


class SettingsError(ConfigError):
    """A setting is invalid: ``key`` (``section.name``), where it came from, expected vs got, the fix."""

    def __init__(
        self, key: str, expected: str, got: object, fix: str = "", source: str = "", *, secret: bool = False
    ) -> None:
        self.key, self.expected, self.got, self.fix, self.source, self.secret = key, expected, got, fix, source, secret
        where = f" ({source})" if source else ""
        shown = SECRET if secret and got is not None else repr(str(got) if isinstance(got, Path) else got)
        text = f"{key}{where}: expected {expected}, got {shown}"
        super().__init__(f"{text}; {fix}" if fix else text)

    def with_source(self, source: str) -> SettingsError:
        return SettingsError(self.key, self.expected, self.got, self.fix, source, secret=self.secret)


class Invalid(Exception):
    """Raised by a check or a coercion: what was expected (and optionally the fix)."""

    def __init__(self, expected: str, fix: str = "") -> None:
        super().__init__(expected)
        self.expected, self.fix = expected, fix


def meta(
    *, check: Check | None = None, secret: bool = False, parse: Callable[[Any], Any] | None = None, expected: str = ""
) -> dict[str, Any]:
    """A field's metadata: its check, an optional parser of raw values (with what it ``expected``), and
    whether the value is secret (then also pass ``repr=False`` to ``field``)."""
    return {"check": check, "secret": secret, "parse": parse, "expected": expected}


def env_name(key: str) -> str:
    """``kafka.bootstrap_servers`` → ``FERRET_KAFKA_BOOTSTRAP_SERVERS``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def default_fix(key: str) -> str:
    return f"correct {key} in the YAML file or in {env_name(key)}"


# --- checks ---------------------------------------------------------------------------------------------


def _num(x: float) -> str:
    return f"{int(x):,}".replace(",", "_") if float(x).is_integer() else f"{x:g}"


def between(lo: float, hi: float | None = None, what: str = "a number") -> Check:
    def check(value: Any) -> None:
        if value is not None and (value < lo or (hi is not None and value > hi)):
            raise Invalid(f"{what} >= {_num(lo)}" if hi is None else f"{what} in [{_num(lo)}, {_num(hi)}]")

    return check


def one_of(names: tuple[str, ...]) -> Check:
    def check(value: Any) -> None:
        if value not in names:
            raise Invalid(f"one of {', '.join(names)}")

    return check


_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):([0-9]{1,5})$")


def _host_port(value: str) -> bool:
    match = _HOST_PORT.match(value.strip())
    return match is not None and int(match.group(2)) <= 65535


def check_bootstrap(value: str) -> None:
    if not value.strip() or not all(_host_port(p) for p in value.split(",")):
        raise Invalid("a comma-separated list of HOST:PORT (e.g. 127.0.0.1:9092,kafka-1:9092)")


def check_listen(value: str) -> None:
    if not _host_port(value):
        raise Invalid("HOST:PORT to listen on (e.g. 127.0.0.1:50051, [::]:50051; port 0 picks a free one)")


def check_prefix(value: str) -> None:
    try:
        TopicNames(value)
    except ConfigError:
        raise Invalid("1-200 characters from letters, digits, '.', '_' and '-' (e.g. ferret)") from None


def check_name(value: str | None) -> None:
    if value is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", value):
        raise Invalid("1-128 characters from letters, digits, '.', '_' and '-'")


def check_redis_url(value: str) -> None:
    if not re.match(r"^(redis|rediss|unix)://", value):
        raise Invalid("a redis://, rediss:// or unix:// URL (e.g. redis://127.0.0.1:6379/0)")


def check_device(value: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?|mps", value):
        raise Invalid("cpu, cuda, cuda:N or mps")


def check_file(value: Path | None) -> None:
    if value is not None and not value.is_file():
        raise Invalid("the path of an existing file", "create the file or correct the path")


# --- parsers of raw values (strings from YAML or the environment) ---------------------------------------


def parse_budget(raw: Any) -> int:
    if isinstance(raw, bool):
        raise ValueError(raw)
    return raw if isinstance(raw, int) else parse_bytes(str(raw))


def parse_arrival(raw: Any) -> ArrivalInterval | Measured:
    if isinstance(raw, ArrivalInterval):
        return raw
    if isinstance(raw, str) and raw.strip().lower() == "measured":
        return "measured"
    if isinstance(raw, bool):
        raise ValueError(raw)
    try:
        return arrival_interval_type(str(raw))
    except Exception:
        raise ValueError(raw) from None


def parse_rate(raw: Any) -> float | None:
    """Items per second; ``max`` (or null) is None: as fast as possible."""
    if isinstance(raw, str) and raw.strip().lower() == "max":
        return None
    if isinstance(raw, bool):
        raise ValueError(raw)
    value = float(raw)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(raw)
    return value


# --- types ----------------------------------------------------------------------------------------------


def is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def describe(tp: Any) -> str:
    """What a value of type ``tp`` looks like, for messages."""
    if is_optional(tp):
        rest = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(describe(a) for a in rest) + " or null"
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join(describe(a) for a in get_args(tp))
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(tp))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a file path"}
    if get_origin(tp) is dict:
        return "a mapping of names to scalar values"
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def has_type(value: Any, tp: Any) -> bool:
    """Whether ``value`` (already coerced) is of the annotated type ``tp``."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(has_type(value, a) for a in get_args(tp))
    if origin is Literal:
        return value in get_args(tp)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return isinstance(value, tp)


def coerce(tp: Any, value: Any) -> Any:
    """A raw value (YAML scalar or mapping, or an environment string) as type ``tp``; raises :class:`Invalid`.

    Strings are parsed: ``null``/``none``/empty → None for optional types, ``true``/``yes``/``on``/``1``
    and their opposites for booleans, numbers (``1e-3``, which YAML 1.1 leaves a string), YAML/JSON
    mappings.
    """
    text = value.strip() if isinstance(value, str) else None
    if is_optional(tp):
        if value is None or (text is not None and text.lower() in NULLS):
            return None
        inner = [a for a in get_args(tp) if a is not type(None)]
        tp = inner[0] if len(inner) == 1 else Union[tuple(inner)]  # noqa: UP007
    origin = get_origin(tp)
    if origin is Literal:
        if (text if text is not None else value) in get_args(tp):
            return text if text is not None else value
    elif tp is bool:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text is not None and re.fullmatch(r"[+-]?[0-9][0-9_]*", text):
            return int(text)
    elif tp is float:
        number = _float(text) if text is not None else value
        if isinstance(number, int | float) and not isinstance(number, bool) and math.isfinite(number):
            return float(number)
    elif tp is str:
        if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
            return str(value)
    elif tp is Path:
        if text:
            return Path(text).expanduser()
    elif origin is dict:
        mapping = _yaml(text) if text is not None else value
        if isinstance(mapping, dict) and all(
            isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in mapping.items()
        ):
            return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in mapping.items()}
    raise Invalid(describe(tp))


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text else {}
    except yaml.YAMLError:
        return None
