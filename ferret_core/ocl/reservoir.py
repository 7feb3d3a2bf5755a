"""The replay buffer of ER and MIR: reservoir sampling over the samples a method trains.

Reservoir sampling (Vitter 1985, Algorithm R; the memory of ER in Chaudhry et al. 2019, "On Tiny Episodic
Memories in Continual Learning"). **Invariant**: after t samples were added, the buffer holds
min(t, capacity) of them, and each of the t is held with probability min(1, capacity / t), whatever the
order they came in. The t-th sample (t > capacity) replaces a uniformly drawn slot with probability
capacity / t.

Storage is preallocated at the first sample: ``capacity`` float32 inputs and int64 labels (what the
memory model counts as the replay buffer, DESIGN §3.8, plus 8 bytes of label per item).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

from ferret_core.engine.steps import Batch
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
        self._generator = torch.Generator().manual_seed(seed)

    def add(self, batch: Batch) -> None:
        """Offer every sample of ``batch`` to the reservoir, in order."""
        x = batch.x.detach().to("cpu", torch.float32)
        if self._x is None:
            self._x = torch.zeros((self.capacity, *x.shape[1:]), dtype=torch.float32)
        elif tuple(x.shape[1:]) != tuple(self._x.shape[1:]):
            held, got = tuple(self._x.shape[1:]), tuple(x.shape[1:])
            raise ConfigError(f"replay buffer holds samples of shape {held}, got {got}")
        for row in range(len(batch)):
            self.seen += 1
            if self.size < self.capacity:
                slot = self.size
                self.size += 1
            else:
                slot = int(torch.randint(0, self.seen, (), generator=self._generator))
                if slot >= self.capacity:
                    continue
            self._x[slot] = x[row]
            self._y[slot] = batch.y[row]

    def sample(self, count: int) -> Batch | None:
        """``min(count, size)`` held samples drawn uniformly without replacement (``None`` when empty)."""
        k = min(count, self.size)
        if k == 0 or self._x is None:
            return None
        rows = torch.randperm(self.size, generator=self._generator)[:k]
        return Batch(self._x[rows], self._y[rows])

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
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ConfigError(f"replay buffer state has capacity {state['capacity']}, this buffer {self.capacity}")
        self.size, self.seen = int(state["size"]), int(state["seen"])
        self._x = None if state["x"] is None else state["x"].clone()
        self._y = state["y"].clone()
        self._generator.set_state(state["generator"])
