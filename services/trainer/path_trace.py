"""Where a record's latency goes: an optional per-record trace of the record path (a diagnosis aid for
the latency benchmarks, off by default).

Set ``FERRET_TRACE_RECORD_PATH=/some/file.jsonl`` in the trainer's environment and every valid sample
adds one JSON line with wall-clock stamps in ms (``time.time()``): ``event`` (the producer's event time),
``fetched`` (the loop's ``consume()`` returned the batch holding it), ``arrive`` / ``predicted`` (handed
to the learner's ``submit`` / its outcome returned: the prediction executor's queue, the forward pass and
the dispatch), ``published`` (handed to the producer), and ``batch`` / ``position`` (the batch's size and
the record's place in it). The loop hands a whole batch to the learner before awaiting the first outcome,
so waiting for a batch's earlier records shows in ``predicted − arrive``; before that change (commit
b10499b; the ``-before`` results) it showed in ``arrive − fetched``. Every pause of the loop
(``calls.serve``: re-plans, snapshots, restores; periodic snapshots) adds a ``{"pause": ms, "at": ms}``
line. Reading it: ``fetched − event`` is the Kafka hop plus the loop's backlog, ``published − predicted``
building and producing the Prediction (``latency_ms`` = ``published − event``).

Each record's line also carries ``cpu`` (the loop thread's CPU time, ms) and, where the learner has one
(``EngineLearner.trace_view``), the admission's view of worker 0 (``WallClock.admission_view``: ``service_s``,
``wait_s``, ``start_slots``, ``waiting``, ``executor_s``, ``charged_s``), read by
``benchmarks/live/admission_trace.py``. ``{pid}`` in the path is replaced by the process id.

Read from the environment (not the config) because it is a measurement aid, not a setting of the service.
"""

from __future__ import annotations

import json
import os
import time
from typing import IO

TRACE_ENV = "FERRET_TRACE_RECORD_PATH"


def wall_ms() -> float:
    return time.time() * 1000.0


class PathTrace:
    """Appends one JSON line per traced record or pause; :meth:`from_env` gives ``None`` when off."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", buffering=1 << 16)  # noqa: SIM115 (closed by close())

    @classmethod
    def from_env(cls) -> PathTrace | None:
        path = os.environ.get(TRACE_ENV)
        return cls(path.replace("{pid}", str(os.getpid()))) if path else None  # {pid}: one file per process

    def record(self, stamps: dict[str, float | int | str | None]) -> None:
        self._file.write(json.dumps(stamps, separators=(",", ":")) + "\n")

    def pause(self, began_ms: float, ended_ms: float, what: str) -> None:
        self.record({"pause": round(ended_ms - began_ms, 3), "at": round(began_ms, 3), "what": what})

    def close(self) -> None:
        self._file.close()
