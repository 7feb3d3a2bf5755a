"""The declared stream rate a producer stamps on its records (DESIGN §4 "Arrival interval for the live
planner"): ``ferret produce --rate R`` adds two headers to every sample record, ``ferret.rate`` (R items
per second, the whole stream, decimal text) and ``ferret.partitions`` (the samples topic's partitions
when the producer started). A trainer that owns a of those partitions expects R·a/partitions items per
second (keys spread items evenly over partitions) and plans for that until it has measured the stream
(``services.trainer.arrivals``). A declared rate is advice: headers that do not parse are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

RATE_HEADER = "ferret.rate"
PARTITIONS_HEADER = "ferret.partitions"
HeaderValue = str | bytes | None
Headers = Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue]  # as confluent-kafka gives them


def rate_headers(rate: float, partitions: int) -> list[tuple[str, HeaderValue]]:
    """The headers a producer sending ``rate`` items/s over ``partitions`` sample partitions stamps."""
    return [(RATE_HEADER, f"{rate:.6g}".encode()), (PARTITIONS_HEADER, str(max(1, partitions)).encode())]


def declared_interval(headers: Headers | None, owned: int) -> float | None:
    """Seconds between the items a trainer owning ``owned`` sample partitions receives, from a record's
    rate headers (``owned`` 0: unknown, the whole stream); None when it has none or they do not parse."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found = {name: _text(value) for name, value in pairs if name in (RATE_HEADER, PARTITIONS_HEADER)}
    try:
        rate = float(found.get(RATE_HEADER) or "nan")
        partitions = int(found.get(PARTITIONS_HEADER) or "1")
    except ValueError:
        return None
    if not (math.isfinite(rate) and rate > 0 and partitions > 0):
        return None
    share = min(owned, partitions) / partitions if owned > 0 else 1.0
    return 1.0 / (rate * share)


def _text(value: HeaderValue) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value or ""
