"""The per-stage ring of master-parameter deltas that iterative compensation walks (DESIGN §3.4).

Iterative compensation (Alg. 1, lines 8–9) needs θ^{t+k−1} − θ^{t+k−2} for every master update of the
stage since the gradient's version. A :class:`DeltaRing` keeps the last ``capacity`` of them; the engine
sizes ``capacity`` to the staleness bound its schedule derives (DESIGN §3.13: not P−1 once N > 1), and
its bytes are compensator state (DESIGN §3.8).

Invariant: after ``n`` pushes the ring holds the last ``min(n, capacity)`` deltas, in push order. Slots
are allocated on the first ``capacity`` pushes and then overwritten in place (``copy_``), so a full ring
costs exactly ``capacity`` copies of the stage's parameters and the hot path allocates nothing.

Two kinds of storage, one logic. A ring built with ``DeltaRing(capacity)`` owns its slots (allocated as
it fills) and its counters. One built over **pre-allocated slots and a counter tensor**
(``DeltaRing(capacity, slots=..., counters=...)``) writes into those and keeps its counters (pushed,
head, held) in that tensor, so several objects over the same shared memory — the executor processes of
one stage (:mod:`ferret_core.engine.processes.deltas`) — are one ring: what one pushes, every other
reads. Such a ring cannot grow (its slots are fixed); callers serialise pushes and reads (the stage's
update lock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ferret_core.errors import ConfigError

_PUSHED, _HEAD, _HELD = 0, 1, 2  # the counter tensor: deltas pushed, slot the next full push writes, held
COUNTERS = 3  # int64 elements of a ring's counter tensor


def _check_capacity(capacity: object) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ConfigError(
            f"delta ring capacity must be an int >= 0 (the schedule's staleness bound), got {capacity!r}"
        )
    return capacity


class DeltaRing:
    """The last ``capacity`` parameter deltas of one stage, each a list aligned with its parameters.

    ``slots`` (``capacity`` lists of tensors shaped like the stage's parameters) and ``counters`` (an int64
    tensor of :data:`COUNTERS` elements, zeros for an empty ring) make a ring over storage someone else
    allocated (see the module docstring); without them the ring allocates its own."""

    def __init__(
        self, capacity: int, *, slots: Sequence[Sequence[Tensor]] | None = None, counters: Tensor | None = None
    ) -> None:
        self.capacity = _check_capacity(capacity)
        self.limit = capacity  # how far :meth:`grow` may go when asked by a caller that allows growth
        self._fixed = slots is not None
        if (slots is None) != (counters is None):
            raise ConfigError("a delta ring over given storage needs both its slots and its counters, got one")
        if slots is not None and len(slots) != capacity:
            raise ConfigError(
                f"a delta ring of capacity {capacity} needs {capacity} pre-allocated slots, got {len(slots)}"
            )
        if counters is not None and (counters.dtype != torch.int64 or tuple(counters.shape) != (COUNTERS,)):
            raise ConfigError(
                f"a delta ring's counters are an int64 tensor of shape ({COUNTERS},), got {counters.dtype} "
                f"{tuple(counters.shape)}"
            )
        self._slots: list[list[Tensor]] = [] if slots is None else [list(s) for s in slots]
        self._counters = torch.zeros(COUNTERS, dtype=torch.int64) if counters is None else counters
        self._storages: list[tuple[int, int]] | None = None  # storage keys of the slots (they never move)

    # ----------------------------------------------------------------------------------- counters
    @property
    def _count(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The counters as a numpy view of their tensor (element ops in ~0.1 µs; made per process and per
        copy, never pickled)."""
        view = self.__dict__.get("_count_view")
        if view is None:
            view = self.__dict__["_count_view"] = self._counters.numpy()
        return view

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_count_view", None)
        return state

    @property
    def pushed(self) -> int:
        """Deltas pushed since construction (the stage's master version, if started at 0)."""
        return int(self._count[_PUSHED])

    @property
    def _head(self) -> int:
        """The slot the next push writes once the ring is full (= the oldest delta)."""
        return int(self._count[_HEAD])

    def __len__(self) -> int:
        return int(self._count[_HELD])

    @property
    def shared(self) -> bool:
        """Whether the ring writes into storage it was given (pre-allocated slots and counters)."""
        return self._fixed

    # ------------------------------------------------------------------------------------- pushes
    def push(self, delta: Sequence[Tensor]) -> None:
        """Store a copy of ``delta`` (θ_new − θ_old of every parameter), evicting the oldest when full."""
        index = self._claim()
        if index is None:
            return
        if index == len(self._slots):
            self._slots.append([d.detach().clone() for d in delta])
            self._storages = None
            return
        torch._foreach_copy_(self._slots[index], list(delta))

    def push_difference(self, new: Sequence[Tensor], old: Sequence[Tensor]) -> None:
        """Store ``new − old`` (the master's update) computed straight into the slot it occupies: the same
        values as ``push([n - o ...])``, without the temporary once the slot exists."""
        index = self._claim()
        if index is None:
            return
        with torch.no_grad():
            if index == len(self._slots):
                self._slots.append([n.detach() - o.detach() for n, o in zip(new, old, strict=True)])
                self._storages = None
                return
            for slot, n, o in zip(self._slots[index], new, old, strict=True):
                torch.sub(n, o, out=slot)

    def _claim(self) -> int | None:
        """Count one push and say where it goes: the slot index it writes (``len(self._slots)``: a slot to
        allocate), or None when the ring keeps nothing (capacity 0)."""
        count = self._count
        count[_PUSHED] += 1
        if self.capacity == 0:
            return None
        held = int(count[_HELD])
        if held < self.capacity:  # not full: the head stays at 0 and the next free slot is ``held``
            count[_HELD] = held + 1
            return held
        head = int(count[_HEAD])
        count[_HEAD] = (head + 1) % self.capacity
        return head

    # ------------------------------------------------------------------------------------- sizing
    def _growth_allowed(self, capacity: int) -> bool:
        return capacity <= self.limit

    def grow(self, capacity: int) -> None:
        """Hold up to ``capacity`` deltas from now on (never shrinks): the held ones keep their order and
        the next pushes fill the new slots before the oldest is overwritten again. A ring over given
        slots cannot grow."""
        if capacity <= self.capacity:
            return
        if self._fixed:
            raise ConfigError(
                f"a delta ring over pre-allocated slots holds {self.capacity} deltas and cannot grow to {capacity}; "
                "allocate the shared ring for the larger bound"
            )
        self._slots = self._ordered()  # oldest first
        self._count[_HEAD] = 0
        self.capacity = capacity

    def refit(self, capacity: int, limit: int) -> None:
        """Before anything was pushed: hold ``capacity`` deltas, and let :meth:`grow` go up to ``limit``
        (the engine: the staleness its schedule reaches, replayed, and the plan's bound)."""
        if self.pushed or len(self):
            raise ConfigError(f"refit a delta ring before its first push, got one with {self.pushed} pushed")
        capacity = _check_capacity(capacity)
        if self._fixed and capacity != self.capacity:
            raise ConfigError(
                f"a delta ring over pre-allocated slots keeps its capacity {self.capacity}, asked to refit to "
                f"{capacity}"
            )
        self.capacity = capacity
        self.limit = max(capacity, limit)

    # -------------------------------------------------------------------------------------- reads
    def _ordered(self) -> list[list[Tensor]]:
        """The held slots, oldest first (not full: slots 0..held−1 with the head at 0)."""
        held, head = len(self), self._head
        if held < len(self._slots):
            return self._slots[:held]
        return self._slots[head:] + self._slots[:head]

    def recent(self, count: int) -> list[list[Tensor]]:
        """The most recent ``min(count, len(self))`` deltas, OLDEST FIRST.

        The returned tensors are the ring's own storage: read them before the next :meth:`push`.
        """
        ordered = self._ordered()
        count = max(0, min(count, len(ordered)))
        return ordered[len(ordered) - count :]

    def state_tensors(self) -> list[Tensor]:
        """Every tensor the ring holds (a ring over given slots: all of them, filled or not)."""
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
            "deltas": [[t.detach().clone() for t in slot] for slot in self._ordered()],
        }

    def load_state_dict(
        self,
        state: Mapping[str, Any],
        *,
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[torch.dtype],
        device: torch.device,
    ) -> None:
        """Restore a snapshot; deltas move to ``device`` and the stage's parameter ``dtypes`` (a ring over
        given slots copies them into its slots)."""
        capacity = int(state["capacity"])
        if capacity > self.capacity and self._growth_allowed(capacity) and not self._fixed:
            self.grow(capacity)  # a ring that grew on the wall clock (``grow``) restores as large
        if capacity < self.capacity and not self.pushed and not len(self) and not self._fixed:
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
        if self._fixed:
            for dst, src in zip(self._slots, slots, strict=False):
                torch._foreach_copy_(dst, src)
        else:
            self._slots = slots
            self._storages = None
        count = self._count
        count[_HEAD] = 0  # slots are oldest first: a full ring overwrites slot 0 next
        count[_HELD] = len(slots)
        count[_PUSHED] = int(state["pushed"])
