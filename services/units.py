"""Value types the services share: byte sizes, arrival intervals and stream rates (STYLE worked example 6).

Config, trainer, demo and CLI all read and print these quantities the same way, so they live here, below
every one of them: the CLI wraps them in argparse types (``services.cli.args``), the settings parse raw
YAML / environment values with them (``services.config``), and nothing here imports a service.

Every parser raises ``ValueError`` naming the accepted forms; callers turn it into their own error type
(``argparse.ArgumentTypeError``, ``SettingsError``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SUFFIXES = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """``"512MiB"`` → 536870912; plain integers are bytes. Raises ``ValueError`` with the accepted forms."""
    match = _BYTES_RE.match(text)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _SUFFIXES:
        raise ValueError(
            f"invalid byte size {text!r}: expected an integer number of bytes or a number with one of "
            "the suffixes B, KB, MB, GB, KiB, MiB, GiB (e.g. 2429288, 512MiB, 2GB)"
        )
    value = float(match.group(1)) * _SUFFIXES[unit]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"invalid byte size {text!r}: must be finite and >= 0")
    return round(value)


def format_bytes(value: float) -> str:
    """``1536`` → ``"1.50 KiB"`` (binary units, two decimals above a KiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


@dataclass(frozen=True)
class ArrivalInterval:
    """An arrival interval as a user writes it: ``auto`` (= max_i t̂_i^f, the paper's rate, DESIGN §4),
    ``Kx`` (K times that) or a number of seconds."""

    multiple: float | None = 1.0  # set for auto / Kx
    seconds: float | None = None  # set for an absolute interval

    @classmethod
    def parse(cls, text: str) -> ArrivalInterval:
        """``"auto"``, ``"2x"``, ``"0.02"``; raises ``ValueError`` naming the accepted forms."""
        raw = text.strip().lower()
        try:
            if raw == "auto":
                return cls(multiple=1.0)
            if raw.endswith("x"):
                value = float(raw[:-1])
                if not (math.isfinite(value) and value > 0):
                    raise ValueError
                return cls(multiple=value)
            seconds = float(raw)
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError
            return cls(multiple=None, seconds=seconds)
        except ValueError:
            raise ValueError(
                f"invalid arrival interval {text!r}: expected 'auto' (= max_i t̂_i^f, the paper's rate), "
                "'Kx' (K times that, e.g. 2x) or a positive number of seconds"
            ) from None

    def resolve(self, max_forward_time: float) -> float:
        """Seconds, given the profile's max_i t̂_i^f."""
        if self.seconds is not None:
            return self.seconds
        assert self.multiple is not None
        return self.multiple * max_forward_time

    def __str__(self) -> str:
        if self.seconds is not None:
            return f"{self.seconds:g}"
        return "auto" if self.multiple == 1.0 else f"{self.multiple:g}x"


def parse_rate(text: str) -> float | None:
    """Items per second: a positive number, or ``max`` (None: as fast as possible)."""
    raw = text.strip().lower()
    if raw == "max":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"invalid rate {text!r}: expected a positive number of items per second or 'max'")
    return value
