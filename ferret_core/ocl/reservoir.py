"""The replay buffer of ER and MIR: reservoir sampling over the samples a method trains.

Reservoir sampling (Vitter 1985, Algorithm R; the memory of ER in Chaudhry et al. 2019, "On Tiny Episodic
Memories in Continual Learning"). **Invariant**: after t samples were added, the buffer holds
min(t, capacity) of them, and each of the t is held with probability min(1, capacity / t), whatever the
order they came in. The t-th sample (t > capacity) replaces a uniformly drawn slot with probability
capacity / t.

Storage is preallocated at the first sample: ``capacity`` float32 inputs and int64 labels (what the
memory model counts as the replay buffer, DESIGN §3.8, plus 8 bytes of label per item).

Eviction: a sample whose step's loss or gradient turned out non-finite is removed again
(:meth:`ReservoirBuffer.evict`; the engine calls it through the step's :class:`~ferret_core.engine.steps.Held`
rows), else it would be replayed, and poison a step, until the reservoir happens to overwrite it. The
hole is filled with the last held sample, so the buffer holds one sample fewer and refills from the next
ones (the reservoir's equal-probability invariant is then approximate). Each slot remembers the number
``seen`` at its insertion as its stamp (a Python list: bookkeeping, not counted as tensor bytes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from ferret_core.engine.steps import Batch, Held
from ferret_core.errors import ConfigError


class ReservoirBuffer:
    """A fixed-capacity uniform sample of every sample added (see the module docstring)."""

    def __init__(self, capacity: int, *, seed: int = 0) -> None:
        if capacity < 1:
            raise ConfigError(f"a replay buffer needs a capacity >= 1 items, got {capacity}")
        self.capacity = capacity
        self.size = 0
        self.seen = 0
        self._x: Tensor | None = None
        self._y = torch.zeros(capacity, dtype=torch.long)
        self._stamps = [0] * capacity  # ``seen`` when the slot took its sample
        self._generator = torch.Generator().manual_seed(seed)

    def add(self, batch: Batch) -> tuple[Held | None, ...]:
        """Offer every sample of ``batch`` to the reservoir, in order; returns where each row is held
        (``None``: not taken)."""
        x = batch.x.detach().to("cpu", torch.float32)
        if self._x is None:
            self._x = torch.zeros((self.capacity, *x.shape[1:]), dtype=torch.float32)
        elif tuple(x.shape[1:]) != tuple(self._x.shape[1:]):
            kept, got = tuple(self._x.shape[1:]), tuple(x.shape[1:])
            raise ConfigError(f"replay buffer holds samples of shape {kept}, got {got}")
        held: list[Held | None] = []
        for row in range(len(batch)):
            self.seen += 1
            if self.size < self.capacity:
                slot = self.size
                self.size += 1
            else:
                slot = int(torch.randint(0, self.seen, (), generator=self._generator))
                if slot >= self.capacity:
                    held.append(None)
                    continue
            self._x[slot] = x[row]
            self._y[slot] = batch.y[row]
            self._stamps[slot] = self.seen
            held.append(Held(self, slot, self.seen))
        return tuple(held)

    def sample(self, count: int) -> Batch | None:
        """``min(count, size)`` held samples drawn uniformly without replacement (``None`` when empty)."""
        k = min(count, self.size)
        if k == 0 or self._x is None:
            return None
        rows = torch.randperm(self.size, generator=self._generator)[:k]
        held = tuple(Held(self, slot, self._stamps[slot]) for slot in rows.tolist())
        return Batch(self._x[rows], self._y[rows], held=held)

    def evict(self, slot: int, stamp: int) -> bool:
        """Remove the sample inserted as ``stamp`` (see the module docstring); False when it is gone."""
        if not (slot < self.size and self._stamps[slot] == stamp):
            live = self._stamps[: self.size]
            if stamp not in live:
                return False
            slot = live.index(stamp)
        last = self.size - 1
        if self._x is not None and slot != last:
            self._x[slot] = self._x[last]
            self._y[slot] = self._y[last]
            self._stamps[slot] = self._stamps[last]
        self._stamps[last] = 0
        self.size = last
        return True

    def rows(self, rows: Tensor) -> Batch:
        """The held samples at ``rows`` (indices below :attr:`size`)."""
        if self._x is None:
            raise ConfigError("the replay buffer is empty")
        return Batch(self._x[rows], self._y[rows])

    def state_tensors(self) -> Iterator[Tensor]:
        if self._x is not None:
            yield self._x
        yield self._y

    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "size": self.size,
            "seen": self.seen,
            "x": None if self._x is None else self._x.clone(),
            "y": self._y.clone(),
            "stamps": list(self._stamps),
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ConfigError(f"replay buffer state has capacity {state['capacity']}, this buffer {self.capacity}")
        self.size, self.seen = int(state["size"]), int(state["seen"])
        self._x = None if state["x"] is None else state["x"].clone()
        self._y = state["y"].clone()
        # snapshots before eviction existed carry no stamps: number the held samples afresh
        self._stamps = list(state.get("stamps") or [i + 1 for i in range(self.capacity)])
        self._generator.set_state(state["generator"])
