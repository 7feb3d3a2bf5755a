"""Follows a trainer's model stream and puts each newer update in force (a thread of ``ferret serve``).

Start: the newest complete update on the stream (one ``XREVRANGE``), then ``XREAD BLOCK`` from there; of
several updates read at once only the newest is rebuilt. An update is put in force whatever its version
(a trainer that rolled back publishes a lower one: the stream's order is the truth). Redis errors and
corrupt updates are logged and retried with backoff; the model in force keeps answering meanwhile.
"""

from __future__ import annotations

import logging
import threading

import redis

from services.serving.errors import ExportError, ModelStreamError
from services.serving.export_files import decode_weights
from services.serving.holder import ModelHolder, ServedModel
from services.serving.model_card import rebuild
from services.serving.model_stream import ModelStreamReader, ModelUpdate

log = logging.getLogger("ferret.serve")

BLOCK_MS = 1000
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class ModelFollower:
    """Reads ``reader`` and swaps ``holder``'s model (module docstring)."""

    def __init__(self, reader: ModelStreamReader, holder: ModelHolder, block_ms: int = BLOCK_MS) -> None:
        self._reader = reader
        self._holder = holder
        self._block_ms = block_ms
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> ModelFollower:
        self._thread = threading.Thread(target=self.run, args=(self._stop,), name="ferret-model-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self, stop: threading.Event) -> None:
        after: bytes | None = None  # None: not started (read the newest first)
        failures = 0
        while not stop.is_set():
            try:
                if after is None:
                    newest = self._reader.newest()
                    after = newest.entry_id if newest is not None else b"0-0"
                    updates = [newest] if newest is not None else []
                else:
                    updates = self._reader.follow(after, self._block_ms)
                if updates:
                    after = updates[-1].entry_id
                    self._apply(updates[-1])
                failures = 0
            except (redis.RedisError, ModelStreamError, ExportError) as exc:
                delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                log.warning("model stream %s: %s (retrying in %.1f s)", self._reader.key, exc, delay)
                stop.wait(delay)

    def _apply(self, update: ModelUpdate) -> None:
        weights = decode_weights(update.data, f"model update v{update.version}")
        served = ServedModel.of(
            rebuild(update.card, weights), update.card, update.version, update.update_ms, update.lineage
        )
        self._holder.set(served)
        # one line per update (~1/s): what benchmarks/serving measures freshness from
        log.info("model v%d in force: trainer update %d ms, received %d ms, %d bytes", served.version,
                 served.update_ms, served.received_ms, len(update.data))  # fmt: skip
