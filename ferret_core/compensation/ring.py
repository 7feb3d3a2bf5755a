"""The per-stage ring of master-parameter deltas that iterative compensation walks (DESIGN §3.4).

Iterative compensation (Alg. 1, lines 8–9) needs θ^{t+k−1} − θ^{t+k−2} for every master update of the
stage since the gradient's version. A :class:`DeltaRing` keeps the last ``capacity`` of them; the engine
sizes ``capacity`` to the staleness bound its schedule derives (DESIGN §3.13: not P−1 once N > 1), and
its bytes are compensator state (DESIGN §3.8).

Invariant: after ``n`` pushes the ring holds the last ``min(n, capacity)`` deltas, in push order. Slots
are allocated on the first ``capacity`` pushes and then overwritten in place (``copy_``), so a full ring
costs exactly ``capacity`` copies of the stage's parameters and the hot path allocates nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ferret_core.errors import ConfigError


class DeltaRing:
    """The last ``capacity`` parameter deltas of one stage, each a list aligned with its parameters."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ConfigError(
                f"delta ring capacity must be an int >= 0 (the schedule's staleness bound), got {capacity!r}"
            )
        self.capacity = capacity
        self.limit = capacity  # how far :meth:`grow` may go when asked by a caller that allows growth
        self._slots: list[list[Tensor]] = []
        self._head = 0  # slot the next push writes once the ring is full (= the oldest delta)
        self.pushed = 0  # deltas pushed since construction (the stage's master version, if started at 0)
        self._storages: list[tuple[int, int]] | None = None  # storage keys of the slots (they never move)

    def __len__(self) -> int:
        return len(self._slots)

    def push(self, delta: Sequence[Tensor]) -> None:
        """Store a copy of ``delta`` (θ_new − θ_old of every parameter), evicting the oldest when full."""
        self.pushed += 1
        if self.capacity == 0:
            return
        if len(self._slots) < self.capacity:
            self._slots.append([d.detach().clone() for d in delta])
            self._storages = None
            return
        torch._foreach_copy_(self._slots[self._head], list(delta))
        self._head = (self._head + 1) % self.capacity

    def _growth_allowed(self, capacity: int) -> bool:
        return capacity <= self.limit

    def grow(self, capacity: int) -> None:
        """Hold up to ``capacity`` deltas from now on (never shrinks): the held ones keep their order and
        the next pushes fill the new slots before the oldest is overwritten again."""
        if capacity <= self.capacity:
            return
        self._slots = self._slots[self._head :] + self._slots[: self._head]  # oldest first
        self._head = 0
        self.capacity = capacity

    def refit(self, capacity: int, limit: int) -> None:
        """Before anything was pushed: hold ``capacity`` deltas, and let :meth:`grow` go up to ``limit``
        (the engine: the staleness its schedule reaches, replayed, and the plan's bound)."""
        if self.pushed or self._slots:
            raise ConfigError(f"refit a delta ring before its first push, got one with {self.pushed} pushed")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ConfigError(f"delta ring capacity must be an int >= 0, got {capacity!r}")
        self.capacity = capacity
        self.limit = max(capacity, limit)

    def recent(self, count: int) -> list[list[Tensor]]:
        """The most recent ``min(count, len(self))`` deltas, OLDEST FIRST.

        The returned tensors are the ring's own storage: read them before the next :meth:`push`.
        """
        count = max(0, min(count, len(self._slots)))
        ordered = self._slots[self._head :] + self._slots[: self._head]
        return ordered[len(ordered) - count :]

    def state_tensors(self) -> list[Tensor]:
        """Every tensor the ring holds."""
        return [t for slot in self._slots for t in slot]

    def storages(self) -> list[tuple[int, int]]:
        """(data_ptr, nbytes) of every slot's storage, cached: slots are overwritten in place, so the keys
        change only when a slot is allocated or a snapshot is loaded (for the engine's memory meter)."""
        if self._storages is None:
            self._storages = [
                (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in self.state_tensors()
            ]
        return self._storages

    def state_dict(self) -> dict[str, Any]:
        """A snapshot: copies of the held deltas (oldest first) and the counters."""
        return {
            "capacity": self.capacity,
            "pushed": self.pushed,
            "deltas": [[t.detach().clone() for t in slot] for slot in self.recent(len(self._slots))],
        }

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        *,
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[torch.dtype],
        device: torch.device,
    ) -> None:
        """Restore a snapshot; deltas move to ``device`` and the stage's parameter ``dtypes``."""
        capacity = int(state["capacity"])
        if capacity > self.capacity and self._growth_allowed(capacity):
            self.grow(capacity)  # a ring that grew on the wall clock (``grow``) restores as large
        if capacity < self.capacity and not self.pushed and not self._slots:
            self.refit(capacity, self.limit)  # one the engine fitted to the staleness reached (``refit``)
        if capacity != self.capacity:
            raise ConfigError(
                f"delta ring snapshot has capacity {capacity}, this ring {self.capacity}; build the "
                f"compensator with ring_capacity={capacity} or drop the snapshot"
            )
        deltas = list(state["deltas"])
        if len(deltas) > capacity:
            raise ConfigError(f"delta ring snapshot holds {len(deltas)} deltas for capacity {capacity}")
        slots: list[list[Tensor]] = []
        for delta in deltas:
            got = [tuple(d.shape) for d in delta]
            if got != [tuple(s) for s in shapes]:
                raise ConfigError(
                    f"delta ring snapshot shapes {got} do not match the stage's parameters {list(shapes)}"
                )
            slots.append([d.to(device=device, dtype=dt, copy=True) for d, dt in zip(delta, dtypes, strict=True)])
        self._slots = slots
        self._storages = None
        self._head = 0  # slots are oldest first: a full ring overwrites slot 0 next
        self.pushed = int(state["pushed"])
