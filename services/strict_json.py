"""Strict JSON out of the services: reports, ``timeline.json``, ``--json`` output and JSON log lines.

Python's ``json.dumps`` writes ``NaN`` and ``Infinity`` by default, which are not JSON (RFC 8259) and which
``jq``, browsers and most other parsers reject. :func:`dumps` maps every non-finite float to ``null`` and
then dumps with ``allow_nan=False``, so a value that slipped through fails loudly instead of writing an
invalid file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``value`` with non-finite floats as null; never writes NaN or Infinity."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)
