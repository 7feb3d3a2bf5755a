"""The trainer's side of the model stream (:mod:`services.serving.model_stream`): every
``trainer.models_interval_s`` the loop thread copies the master (``Learner.master_tensors``: a clone, no
drain, ~1 ms for MNISTNet's 1.2 M parameters) and hands it to one publishing thread, which encodes it as
safetensors and appends it to the stream. The record path never waits for Redis: the hand-off holds one
update at most, and a tick that finds the previous update still being written skips this one (counted as
``skipped_busy``), so a slow or frozen Redis lowers the freshness, never the stream's throughput. A version
already published is not published again (an idle trainer writes nothing). Failures are counted and
logged (at most once per ``LOG_EVERY_S``); they never stop the trainer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from torch import Tensor

from ferret_core.errors import ConfigError
from services.serving.export_files import encode_weights
from services.serving.model_card import ModelCard, model_lineage, model_version, unit_weights
from services.serving.model_stream import ModelStreamWriter

log = logging.getLogger("ferret.trainer")

LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class PublisherStats:
    published: int
    skipped_busy: int
    failures: int
    last_version: int  # -1: none published yet
    last_bytes: int


class ModelPublisher:
    """Publishes the master to the model stream off the record path (module docstring)."""

    def __init__(
        self,
        capture: Callable[[], Mapping[str, Tensor]],
        writer: ModelStreamWriter,
        card: ModelCard,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ConfigError(f"the model stream's interval must be > 0 seconds (0 turns it off), got {interval_s}")
        self._capture = capture
        self._writer = writer
        self._card = card
        self.interval_s = interval_s
        self._clock = clock
        self._next = clock()
        self._handoff: queue.Queue[tuple[int, int, Mapping[str, Tensor]] | None] = queue.Queue(maxsize=1)
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._published = self._skipped = self._failures = self._last_bytes = 0
        self._last_version = -1
        self._captured: tuple[int, int] = (-1, -1)  # (lineage, version) of the last update handed over
        self._logged_at = -LOG_EVERY_S
        self._thread = threading.Thread(target=self._run, name="ferret-model-stream", daemon=True)
        self._thread.start()

    def tick(self) -> None:
        """Called by the loop thread after each batch: capture and hand over when an update is due."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self.interval_s
        if not self._idle.is_set():  # the previous update is still being written: never queue behind it
            with self._lock:
                self._skipped += 1
            return
        tensors = self._capture()
        version = model_version(tensors)
        captured = (model_lineage(tensors), version)
        if captured == self._captured:  # the same weights (a rollback to an equal number is a new lineage)
            return
        self._captured = captured
        self._idle.clear()
        self._handoff.put_nowait((version, time.time_ns() // 1_000_000, tensors))

    def _run(self) -> None:
        while True:
            job = self._handoff.get()
            if job is None:
                return
            version, update_ms, tensors = job
            try:
                data = encode_weights(unit_weights(tensors))
                written = self._writer.publish(version, update_ms, self._card, data, model_lineage(tensors))
                with self._lock:
                    self._published += 1
                    self._last_version, self._last_bytes = version, written
            except (redis.RedisError, OSError, ValueError, RuntimeError) as exc:
                with self._lock:
                    self._failures += 1
                    failures = self._failures
                if time.monotonic() - self._logged_at >= LOG_EVERY_S:
                    self._logged_at = time.monotonic()
                    log.warning("model stream %s: update v%d not published (%d failures so far): %s",
                                self._writer.key, version, failures, exc)  # fmt: skip
            finally:
                self._idle.set()

    def flush(self, timeout_s: float) -> bool:
        """Wait until no update is being written (false: still writing after ``timeout_s``)."""
        return self._idle.wait(timeout_s)

    def stats(self) -> PublisherStats:
        with self._lock:
            return PublisherStats(self._published, self._skipped, self._failures, self._last_version, self._last_bytes)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the publishing thread (an update being written gets ``timeout_s`` to finish)."""
        self._idle.wait(timeout_s)
        try:
            self._handoff.put_nowait(None)
        except queue.Full:
            return  # still writing after the timeout: the daemon thread ends with the process
        self._thread.join(timeout_s)


class ModelStreamCollector(Collector):
    """The publisher's counters for the trainer's Prometheus registry, read at scrape time
    (docs/metrics.md "Model stream")."""

    def __init__(self, stats: Callable[[], PublisherStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        for name, help_text, value in (
            ("ferret_model_stream_published", "Model updates written to the model stream", s.published),
            ("ferret_model_stream_skipped_busy", "Updates skipped: the previous one was still being written",
             s.skipped_busy),
            ("ferret_model_stream_failures", "Updates Redis refused or that failed to encode", s.failures),
        ):  # fmt: skip
            yield CounterMetricFamily(name, help_text, value=value)
        yield GaugeMetricFamily("ferret_model_stream_version", "Model version last published (-1: none)",
                                value=s.last_version)  # fmt: skip
        yield GaugeMetricFamily("ferret_model_stream_update_bytes", "Bytes of the last published update",
                                value=s.last_bytes)  # fmt: skip
