"""The model a serving process answers with: swapped whole when a newer update arrives, read without a
lock (one reference; a ``ServedModel`` never changes once built)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from services.kafka.record_codec import SampleDecoder
from services.serving.errors import NoModelYet
from services.serving.model_card import ModelCard


@dataclass(frozen=True)
class ServedModel:
    """A rebuilt model (eval mode) with its card, its input decoder and where its weights came from."""

    model: nn.Module
    card: ModelCard
    decoder: SampleDecoder
    version: int
    update_ms: int  # the trainer's update wall time (ms)
    received_ms: int  # when this process had it in force (ms)
    lineage: int = 0  # the lineage the version counts along (0: unknown)

    @classmethod
    def of(cls, model: nn.Module, card: ModelCard, version: int, update_ms: int, lineage: int = 0) -> ServedModel:
        return cls(model, card, card.decoder(), version, update_ms, time.time_ns() // 1_000_000, lineage)


class ModelHolder:
    """The model in force (None until the first update). ``on_set`` is called after every swap (the
    server's metrics and health); ``changed`` is set at every swap (tests wait on it)."""

    def __init__(
        self, source: str = "the model stream", on_set: Callable[[ServedModel], None] = lambda served: None
    ) -> None:
        self._current: ServedModel | None = None
        self._source = source
        self._on_set = on_set
        self.changed = threading.Event()

    def get(self) -> ServedModel:
        """The model in force; :class:`NoModelYet` (UNAVAILABLE) before the first update."""
        current = self._current
        if current is None:
            raise NoModelYet(
                f"no model yet: nothing has been published on {self._source}; start the trainer with "
                "trainer.models_interval_s > 0 (default 1 s) and wait for its first update"
            )
        return current

    def peek(self) -> ServedModel | None:
        return self._current

    def set(self, served: ServedModel) -> None:
        self._current = served
        self._on_set(served)
        self.changed.set()
