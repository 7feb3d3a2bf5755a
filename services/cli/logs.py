"""Logging of the services (``ferret run``, ``ferret produce``, ``ferret demo``): plain text for people,
or one JSON object per line for log collectors (``--log-format json``).

A JSON line holds ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message``, the
``process`` id, ``exception`` (the formatted traceback) when there is one, and any ``extra={...}`` fields
the call passed. Values that JSON cannot hold are written with ``str``; NaN and infinities become null,
so every line is strict JSON.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from services import strict_json

LOG_FORMATS: tuple[str, ...] = ("text", "json")
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has: anything else on a record came from ``extra=`` and is written out.
_STANDARD = set(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {"message", "asctime"}


def add_logging_arguments(parser: argparse.ArgumentParser, *, level: str = "INFO") -> None:
    """``--log-level`` and ``--log-format`` with their defaults."""
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=level,
        help=f"least severe level logged (default {level})",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text for people, or json: one JSON object per line for log collectors (default text)",
    )


class JsonFormatter(logging.Formatter):
    """One strict JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        return strict_json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str = "INFO", fmt: str = "text", *, stream: TextIO | None = None) -> None:
    """Route the root logger to ``stream`` (stderr) in ``fmt``, replacing earlier handlers."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
