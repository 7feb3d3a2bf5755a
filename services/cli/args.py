"""Argument types shared by the CLI commands: budgets with suffixes, arrival intervals, decay."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def budget_type(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class ArrivalInterval:
    """The ``--arrival-interval`` value: ``auto`` (= max_i t̂_i^f), ``Kx`` (K times that) or seconds."""

    multiple: float | None = 1.0  # set for auto / Kx
    seconds: float | None = None  # set for an absolute interval

    def resolve(self, max_forward_time: float) -> float:
        if self.seconds is not None:
            return self.seconds
        assert self.multiple is not None
        return self.multiple * max_forward_time

    def __str__(self) -> str:
        if self.seconds is not None:
            return f"{self.seconds:g}"
        return "auto" if self.multiple == 1.0 else f"{self.multiple:g}x"


def arrival_interval_type(text: str) -> ArrivalInterval:
    raw = text.strip().lower()
    try:
        if raw == "auto":
            return ArrivalInterval(multiple=1.0)
        if raw.endswith("x"):
            value = float(raw[:-1])
            if not (math.isfinite(value) and value > 0):
                raise ValueError
            return ArrivalInterval(multiple=value)
        seconds = float(raw)
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError
        return ArrivalInterval(multiple=None, seconds=seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid arrival interval {text!r}: expected 'auto' (= max_i t̂_i^f, the paper's rate), "
            "'Kx' (K times that, e.g. 2x) or a positive number of seconds"
        ) from None


def _number(kind: type[int] | type[float], accept: Callable[[float], bool], expected: str) -> Callable[[str], Any]:
    """An argparse type converting to ``kind`` and accepting values for which ``accept`` holds."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not (math.isfinite(value) and accept(value)):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
positive_float = _number(float, lambda v: v > 0, "a positive number")
non_negative_float = _number(float, lambda v: v >= 0, "a finite number >= 0")
fraction = _number(float, lambda v: 0 <= v <= 1, "a fraction in [0, 1] (e.g. 0.4)")


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"file {text!r} does not exist")
    return path


def default_data_root() -> Path:
    """``../shared/data`` next to the repository when it exists, else ``$XDG_CACHE_HOME/ferret/data``
    (``~/.cache/ferret/data``). Only the CLI resolves this default; the core takes the root explicitly."""
    shared = Path(__file__).resolve().parents[3] / "shared" / "data"
    if shared.is_dir():
        return shared
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ferret" / "data"
