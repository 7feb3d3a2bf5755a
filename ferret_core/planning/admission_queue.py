"""The admission queue's size and bytes: the term the planner adds for it (ours, not in the paper).

On the wall clock every worker keeps a bounded FIFO queue of admitted items waiting for its first stage
(:mod:`ferret_core.engine.admission` has the rule that fills it). The queue holds an item's input and its
label only (no activations: nothing has run yet). Its size is

    K = max(⌈(W + D) / (N·t^d)⌉, ⌈B / N⌉)   items per live worker   (at least 1, at most 4096)

(W: the longest an item may wait, ln 2 / c; D: the consumer's delivery spread; B: the most records one
delivery hands over; N·t^d: the interval between two items of one worker). Its bytes,
K × (input + label) per live worker, are part of the plan's bytes when
:class:`~ferret_core.planning.memory_model.MemorySettings` carries an :class:`AdmissionQueue` (the trainer's
planner does; the virtual clock, which admits by its own ``wait_slots``, does not). This module is
pure arithmetic: the planner (no engine import) and the wall clock both use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ferret_core.errors import ConfigError

MAX_QUEUE_SLOTS = 4096  # a finite bound even when W is infinite (c = 0)


@dataclass(frozen=True)
class AdmissionQueue:
    """What sizes the wall clock's admission queue: D (``delivery_s``), B (``delivery_items``) and W
    (``max_wait_s``; ``None``: ln 2 / c of the plan's decay, resolved by the planner)."""

    delivery_s: float
    delivery_items: int
    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delivery_s) and self.delivery_s >= 0) or self.delivery_items < 1:
            raise ConfigError(
                f"admission queue needs delivery_s >= 0 and delivery_items >= 1, got {self.delivery_s} and "
                f"{self.delivery_items}"
            )
        if self.max_wait_s is not None and (math.isnan(self.max_wait_s) or self.max_wait_s < 0):
            raise ConfigError(f"admission queue's max_wait_s must be >= 0 (or None: ln 2 / c), got {self.max_wait_s}")

    def resolved(self, decay: float) -> AdmissionQueue:
        """This queue with W = ln 2 / c filled in when it was left to the plan's decay ``c``."""
        if self.max_wait_s is not None:
            return self
        return AdmissionQueue(self.delivery_s, self.delivery_items, max_wait(decay))

    def slots(self, arrival_interval: float, num_workers: int) -> int:
        """K for a plan of ``num_workers`` worker slots at arrival interval t^d (:func:`queue_slots`)."""
        if self.max_wait_s is None:
            raise ConfigError("the admission queue's W is not resolved: call resolved(decay) first")
        return queue_slots(self.max_wait_s, self.delivery_s, arrival_interval, num_workers, self.delivery_items)


def max_wait(decay: float) -> float:
    """W = ln 2 / c seconds: an item's data value e^{−c·t} halves after W (``inf`` for c = 0)."""
    if not (math.isfinite(decay) and decay >= 0):
        raise ConfigError(f"decay constant c must be finite and >= 0, got {decay}")
    return math.inf if decay == 0 else math.log(2.0) / decay


def queue_slots(
    max_wait_s: float, delivery_s: float, arrival_interval: float, num_workers: int, delivery_items: int = 1
) -> int:
    """K = max(⌈(W + D) / (N·t^d)⌉, ⌈B / N⌉), at least 1 and at most :data:`MAX_QUEUE_SLOTS`: the items that
    reach one worker (every N-th item, one every N·t^d seconds) while an item waits W, plus one delivery's
    spread D; and at least one worker's share of a delivery of B (``delivery_items``) records."""
    if max_wait_s < 0 or delivery_s < 0 or not arrival_interval > 0 or num_workers < 1 or delivery_items < 1:
        raise ConfigError(
            f"need W >= 0, D >= 0, t^d > 0, N >= 1 and B >= 1, got W={max_wait_s}, D={delivery_s}, "
            f"t^d={arrival_interval}, N={num_workers}, B={delivery_items}"
        )
    span = max_wait_s + delivery_s
    if not math.isfinite(span):
        return MAX_QUEUE_SLOTS
    by_time = math.ceil(span / (num_workers * arrival_interval) - 1e-9)
    by_delivery = math.ceil(delivery_items / num_workers)
    return max(1, min(MAX_QUEUE_SLOTS, max(by_time, by_delivery)))


def queue_bytes(slots: int, live_workers: int, input_elements: int, dtype_bytes: int, label_bytes: int = 0) -> int:
    """Bytes of the admission queues: K items (input, and ``label_bytes`` of label) per live worker."""
    return slots * live_workers * (input_elements * dtype_bytes + label_bytes)
