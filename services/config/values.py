"""Typed values of the settings: the error type, per-field checks and parsers, and the coercion of raw
YAML / environment values to a field's annotated type."""

from __future__ import annotations

import ipaddress
import math
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

import yaml

from ferret_core.errors import ConfigError
from services.kafka.admin import TopicNames
from services.units import ArrivalInterval, parse_bytes
from services.units import parse_rate as parse_rate_text

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
    """Raised by a check or a coercion: what was expected (and optionally the fix). A check of a mapping
    may name the entry (``subkey``, appended to the key) and what it holds (``got``)."""

    def __init__(self, expected: str, fix: str = "", *, subkey: str = "", got: Any = None) -> None:
        super().__init__(expected)
        self.expected, self.fix, self.subkey, self.got = expected, fix, subkey, got


def meta(
    *,
    check: Check | None = None,
    secret: bool = False,
    parse: Callable[[Any], Any] | None = None,
    expected: str = "",
    redact: Callable[[Any], str] | None = None,
    doc: str = "",
) -> dict[str, Any]:
    """A field's metadata: its check, an optional parser of raw values (with what it ``expected``),
    whether the value is secret (then also pass ``repr=False`` to ``field``), how to show it without its
    secret part in messages and logs (``redact``, e.g. a URL's password), and a one-line ``doc`` for the
    JSON Schema."""
    return {"check": check, "secret": secret, "parse": parse, "expected": expected, "redact": redact, "doc": doc}


def shown(value: Any, metadata: Any) -> Any:
    """``value`` as messages may show it (``redact`` applied)."""
    redact = metadata.get("redact") if metadata else None
    return redact(value) if redact is not None and value is not None else value


_SECRET_NAME = re.compile(r"password|secret|token|credential|\.key$|key\.pem|jaas", re.IGNORECASE)


def is_secret_property(name: str) -> bool:
    """Whether a librdkafka property's value may be a secret (never shown)."""
    return bool(_SECRET_NAME.search(name))


def redact_properties(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {k: (SECRET if is_secret_property(str(k)) else v) for k, v in value.items()}


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

    check.bounds = (lo, hi)  # type: ignore[attr-defined]  # for the JSON Schema
    return check


def one_of(names: tuple[str, ...]) -> Check:
    def check(value: Any) -> None:
        if value not in names:
            raise Invalid(f"one of {', '.join(names)}")

    check.choices = names  # type: ignore[attr-defined]  # for the JSON Schema
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


_REDIS_URL = "a redis://, rediss:// or unix:// URL (e.g. redis://127.0.0.1:6379/0, redis://:PASSWORD@host:6379/0)"


def check_redis_url(value: str) -> None:
    """Scheme, numeric port in 1..65535 and numeric database, as redis-py will read them."""
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        raise Invalid(_REDIS_URL, "the port must be a number in 1..65535") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise Invalid(_REDIS_URL)
    if parts.scheme != "unix" and not parts.hostname:
        raise Invalid(_REDIS_URL, "give a host name (e.g. redis://127.0.0.1:6379/0)")
    if port == 0:
        raise Invalid(_REDIS_URL, "the port must be a number in 1..65535")
    database = parts.path.lstrip("/") if parts.scheme != "unix" else ""
    if database and not database.isdigit():
        raise Invalid(_REDIS_URL, f"the database after the last '/' must be a number, got {database!r}")


def redact_url(value: str) -> str:
    """A URL without its password (``redis://user:***@host``)."""
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        password = None
        parts = None
    if parts is None or password is None:
        # unparseable: hide whatever sits between '://' and '@'
        return re.sub(r"(://[^@/]*:)[^@/]*@", r"\1***@", value)
    user = parts.username or ""
    return parts._replace(netloc=f"{user}:***@{parts.netloc.rsplit('@', 1)[1]}").geturl()


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+|[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?)$")


def check_host(value: str) -> None:
    """An IP address or a host name to bind (no port, no scheme)."""
    host = value.strip()
    if not host or not _HOST.match(host):
        raise Invalid("an IP address or host name to bind (e.g. 127.0.0.1, 0.0.0.0, ::, localhost)")
    if host.strip("[]").count(":") or host.replace(".", "").isdigit():
        try:
            ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            raise Invalid("an IP address or host name to bind (e.g. 127.0.0.1, 0.0.0.0, ::, localhost)") from None


def parse_range(raw: Any) -> tuple[float, float]:
    """``[low, high]`` (a YAML list, or text like ``-10,10`` / ``[-10, 10]``) with finite low < high."""
    value = _yaml(raw) if isinstance(raw, str) else raw
    if isinstance(raw, str) and not isinstance(value, list):
        value = [part for part in raw.strip("[] ").split(",") if part.strip()]
    if not isinstance(value, list | tuple) or len(value) != 2 or any(isinstance(v, bool) for v in value):
        raise ValueError(raw)
    low, high = (float(v) for v in value)
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(raw)
    return (low, high)


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
    return ArrivalInterval.parse(str(raw))


def parse_rate(raw: Any) -> float | None:
    """Items per second; ``max`` (or null) is None: as fast as possible."""
    if isinstance(raw, bool):
        raise ValueError(raw)
    return parse_rate_text(str(raw))


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
    if get_origin(tp) is tuple:
        return "[" + ", ".join(describe(a) for a in get_args(tp)) + "]"
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
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[int, ...]: any length
            return isinstance(value, tuple) and all(has_type(v, args[0]) for v in value)
        return (
            isinstance(value, tuple)
            and len(value) == len(args)
            and all(has_type(v, a) for v, a in zip(value, args, strict=True))
        )
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
