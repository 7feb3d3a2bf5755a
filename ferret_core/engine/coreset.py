"""Camel's data management, simplified (Li, Shen, Chen, SIGMOD 2022, "Camel: Managing Data for Efficient
Stream Learning"): coreset selection from a buffer of arrivals, and the update of its buffer of past
representative samples.

* :func:`select_coreset` — Camel reformulates coreset selection as submodular maximisation and solves it
  greedily. Here: the facility-location objective F(S) = Σ_{i ∈ window} max_{s ∈ S, y_s = y_i} sim(i, s)
  with sim = d_max − ‖x_i − x_s‖ (d_max the window's largest pairwise distance), maximised greedily
  (each pick adds the largest marginal gain; the (1 − 1/e) guarantee of submodular greedy), covering
  only same-class items, as Camel's per-class δ-cover does. Each selected item's weight is the share of
  the window it covers (its facility's cluster size), so the weighted loss on the coreset estimates the
  loss on the whole window.
* :class:`RepresentativeBuffer` — Camel keeps a buffer of past representative samples, updated as new data
  arrive. Here: a fixed-capacity buffer that takes each selected sample; when full, the class holding the
  most samples gives up its most redundant one (the smallest distance to its nearest same-class
  neighbour), which keeps the buffer class-balanced and spread out. A sample whose step's loss or
  gradient turned out non-finite is evicted again (:meth:`RepresentativeBuffer.evict`, called by the
  engine through the step's :class:`~ferret_core.engine.steps.Held` rows): kept, it would be replayed
  in, and poison, every later step it is drawn for.

Simplifications, stated: distances are taken in the raw input space (flattened, as given to the model),
not in the model's feature space (no extra forward pass, so no extra virtual time); the buffer keeps
float32 samples (Camel quantizes them with a quantile sketch); the selection's own compute is not
charged on the virtual clock (only model passes are profiled). Memory: the buffer's samples, labels and
nearest-neighbour bookkeeping are preallocated tensors the memory meter sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from ferret_core.engine.steps import Held
from ferret_core.errors import ConfigError


def select_coreset(x: Tensor, y: Tensor, size: int) -> tuple[list[int], Tensor]:
    """Greedy facility-location coreset of ``size`` rows of ``x`` (n, ...) with labels ``y`` (n,):
    (selected row indices in pick order, their weights summing to 1)."""
    n = int(y.shape[0])
    if not 1 <= size <= n:
        raise ConfigError(f"a coreset of {size} items needs 1 <= size <= {n} (the window)")
    flat = x.reshape(n, -1).float()
    dist = torch.cdist(flat, flat)
    same = y.unsqueeze(0) == y.unsqueeze(1)
    d_max = float(dist.max()) if n > 1 else 0.0
    sim = torch.where(same, d_max - dist, torch.zeros_like(dist))  # sim[i, s]: how well s covers i
    cover = torch.zeros(n)
    chosen: list[int] = []
    available = torch.ones(n, dtype=torch.bool)
    for _ in range(size):
        gains = (sim - cover.unsqueeze(1)).clamp(min=0).sum(dim=0)
        gains[~available] = -1.0
        best = int(torch.argmax(gains))  # ties: the lowest index
        chosen.append(best)
        available[best] = False
        cover = torch.maximum(cover, sim[:, best])
    picked = torch.tensor(chosen)
    owner = torch.where(same[:, picked], dist[:, picked], torch.full((n, len(chosen)), float("inf"))).argmin(dim=1)
    counts = torch.bincount(owner, minlength=len(chosen)).float()
    return chosen, counts / counts.sum()


class RepresentativeBuffer:
    """Camel's buffer of past representative samples (see the module docstring).

    Invariant: it holds at most ``capacity`` samples; once full, every insertion removes one sample of a
    class with the most samples, the one closest to its nearest same-class neighbour (the new sample
    itself when it is that one).
    """

    def __init__(self, capacity: int, seed: int = 0) -> None:
        if capacity < 1:
            raise ConfigError(f"Camel's buffer needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self.size = 0
        self._x: Tensor | None = None  # (capacity, *shape) float32, allocated at the first sample
        self._y = torch.zeros(capacity, dtype=torch.long)
        self._nn_dist = torch.full((capacity,), float("inf"))
        self._nn_index = torch.full((capacity,), -1, dtype=torch.int32)
        self._stamps = [0] * capacity  # the insertion number of each slot's sample (bookkeeping)
        self._added = 0
        self._generator = torch.Generator().manual_seed(seed)

    def add(self, x: Tensor, y: int) -> Held | None:
        """Insert one sample (``x`` without batch dimension); returns where it is held (``None``: it was
        the most redundant sample, not taken)."""
        if self._x is None:
            self._x = torch.zeros((self.capacity, *x.shape), dtype=torch.float32)
        if self.size < self.capacity:
            slot = self.size
            self.size += 1
        else:
            slot = self._victim(x, y)
            if slot < 0:
                return None
            self._remove(slot)
        self._x[slot] = x
        self._y[slot] = y
        self._link(slot)
        self._added += 1
        self._stamps[slot] = self._added
        return Held(self, slot, self._added)

    def sample(self, count: int) -> tuple[Tensor, Tensor, tuple[Held, ...]]:
        """``min(count, size)`` samples drawn uniformly without replacement (seeded), and where each is held."""
        k = min(count, self.size)
        if self._x is None or k == 0:
            return torch.empty(0), torch.empty(0, dtype=torch.long), ()
        rows = torch.randperm(self.size, generator=self._generator)[:k].sort().values
        held = tuple(Held(self, slot, self._stamps[slot]) for slot in rows.tolist())
        return self._x[rows].clone(), self._y[rows].clone(), held

    def evict(self, slot: int, stamp: int) -> bool:
        """Remove the sample inserted as ``stamp`` (``slot`` where it went in; found by its stamp when it
        has moved since); the last held sample moves into the hole. False when it is no longer held."""
        if not (slot < self.size and self._stamps[slot] == stamp):
            live = self._stamps[: self.size]
            if stamp not in live:
                return False
            slot = live.index(stamp)
        assert self._x is not None
        self._remove(slot)
        last = self.size - 1
        if slot != last:
            self._x[slot] = self._x[last]
            self._y[slot] = self._y[last]
            self._nn_dist[slot], self._nn_index[slot] = self._nn_dist[last], self._nn_index[last]
            self._stamps[slot] = self._stamps[last]
            self._nn_index[: self.size][self._nn_index[: self.size] == last] = slot
        self._y[last], self._nn_dist[last], self._nn_index[last], self._stamps[last] = 0, float("inf"), -1, 0
        self.size = last
        return True

    def _same_class(self, y: int, exclude: int = -1) -> Tensor:
        rows = torch.nonzero(self._y[: self.size] == y).flatten()
        return rows[rows != exclude]

    def _victim(self, x: Tensor, y: int) -> int:
        """The slot to overwrite, or -1 when the new sample is the most redundant one."""
        counts = torch.bincount(self._y[: self.size], minlength=max(int(self._y.max()) + 1, y + 1))
        counts[y] += 1  # the new sample competes within its class
        largest = int(torch.argmax(counts))
        rows = self._same_class(largest)
        if rows.numel() == 0:
            return -1
        victim = int(rows[torch.argmin(self._nn_dist[rows])])
        if largest == y and self._x is not None and rows.numel():
            new_nn = float(torch.cdist(x.reshape(1, -1).float(), self._x[rows].reshape(rows.numel(), -1)).min())
            if new_nn <= float(self._nn_dist[victim]):
                return -1
        return victim

    def _remove(self, slot: int) -> None:
        orphans = torch.nonzero(self._nn_index[: self.size] == slot).flatten().tolist()
        self._nn_index[slot] = -1
        self._nn_dist[slot] = float("inf")
        label = int(self._y[slot])
        self._y[slot] = -1  # out of every class while it is empty
        for row in orphans:
            self._relink(int(row), label)

    def _relink(self, row: int, label: int) -> None:
        assert self._x is not None
        others = self._same_class(label, exclude=row)
        if others.numel() == 0:
            self._nn_dist[row], self._nn_index[row] = float("inf"), -1
            return
        d = torch.cdist(self._x[row].reshape(1, -1), self._x[others].reshape(others.numel(), -1)).flatten()
        best = int(torch.argmin(d))
        self._nn_dist[row], self._nn_index[row] = float(d[best]), int(others[best])

    def _link(self, slot: int) -> None:
        assert self._x is not None
        label = int(self._y[slot])
        others = self._same_class(label, exclude=slot)
        if others.numel() == 0:
            self._nn_dist[slot], self._nn_index[slot] = float("inf"), -1
            return
        d = torch.cdist(self._x[slot].reshape(1, -1), self._x[others].reshape(others.numel(), -1)).flatten()
        best = int(torch.argmin(d))
        self._nn_dist[slot], self._nn_index[slot] = float(d[best]), int(others[best])
        closer = d < self._nn_dist[others]
        self._nn_dist[others[closer]] = d[closer]
        self._nn_index[others[closer]] = slot

    def state_tensors(self) -> Iterator[Tensor]:
        if self._x is not None:
            yield self._x
        yield from (self._y, self._nn_dist, self._nn_index)

    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "size": self.size,
            "x": None if self._x is None else self._x.clone(),
            "y": self._y.clone(),
            "nn_dist": self._nn_dist.clone(),
            "nn_index": self._nn_index.clone(),
            "stamps": list(self._stamps),
            "added": self._added,
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ConfigError(f"Camel buffer state has capacity {state['capacity']}, this buffer {self.capacity}")
        self.size = int(state["size"])
        self._x = None if state["x"] is None else state["x"].clone()
        self._y = state["y"].clone()
        self._nn_dist = state["nn_dist"].clone()
        self._nn_index = state["nn_index"].clone()
        # states saved before eviction existed carry no stamps: number the held samples afresh
        self._stamps = list(state.get("stamps") or [i + 1 for i in range(self.capacity)])
        self._added = int(state.get("added", self.capacity))
        self._generator.set_state(state["generator"])
