"""Argument types shared by the CLI commands: argparse wrappers over the value types of
:mod:`services.units` (budgets with suffixes, arrival intervals, rates) and plain number checks."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.units import ArrivalInterval, parse_bytes, parse_rate


def budget_type(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


UNCONSTRAINED_WORDS = ("none", "unconstrained")


def budget_or_unconstrained_type(text: str) -> int | None:
    """A budget as :func:`budget_type` reads it, or None (no budget: unconstrained, the paper's M+) for
    one of :data:`UNCONSTRAINED_WORDS`, in any case."""
    if text.strip().lower() in UNCONSTRAINED_WORDS:
        return None
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; or {' / '.join(UNCONSTRAINED_WORDS)} for no budget") from None


def arrival_interval_type(text: str) -> ArrivalInterval:
    try:
        return ArrivalInterval.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate_type(text: str) -> float:
    """Items per second, or ``max`` (returned as ``math.inf``: no pacing)."""
    try:
        rate = parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return math.inf if rate is None else rate


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
