"""The staleness a configuration's gradients are applied with on the virtual clock, on average (ours).

:mod:`ferret_core.staleness` bounds τ (it sizes the compensator's ring and must hold for any timing); the
planner's accuracy objective (:mod:`ferret_core.planning.staleness_cost`) needs what a plan's gradients
*typically* see. A bound is a poor stand-in: 1 stage × 5 MNISTNet workers have a bound of 8 and apply
every gradient at τ = 4. So :func:`replay_staleness` runs every live worker of the configuration on one
shared master with the engine's own :class:`~ferret_core.schedule.scheduler.Scheduler` (Ferret's rules:
dispatch i ≡ n mod N, ``wait_slots`` waiting items, T3's alignment, the 1F1B cap P − j), arrivals every
t^d, F taking the stage's Σt̂^f and B its Σt̂^b (plus Σt̂^f under T1), completions before arrivals at
equal times — the virtual clock's rules — and counts versions as the engine does
(:mod:`ferret_core.engine.pipeline`): an item reads its worker's replica of stage j at its F; each B adds a
gradient to the worker's buffer; at the c^a-th the buffer is applied, each gradient's τ is the master's
version then minus the version it read, the master's version moves by one and the worker's replica is
refreshed to it. Pure bookkeeping: no torch, no model.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferret_core.errors import ConfigError
from ferret_core.plan import WorkerConfig
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.scheduler import Scheduler

ARRIVALS_PER_SLOT_STAGE = 12  # the replay's length: this many arrivals per worker slot and stage,
MIN_ARRIVALS = 160  # at least this many; the first quarter warms the pipeline up and is not counted
MAX_ARRIVALS = 2048


@dataclass(frozen=True)
class ExpectedStaleness:
    """Per stage, the mean τ of the gradients applied after the warm-up (0 where none was applied),
    and the fraction of the arrivals after the warm-up that were trained (admitted)."""

    mean: tuple[float, ...]
    trained_fraction: float

    def to_dict(self) -> dict[str, object]:
        return {"mean": list(self.mean), "trained_fraction": self.trained_fraction}


class _Rules:
    """Ferret's schedule rules for a tuple of worker configurations (removed ones included)."""

    def __init__(self, workers: Sequence[WorkerConfig], num_stages: int, wait_slots: int) -> None:
        self.workers = tuple(workers)
        self.num_workers = len(self.workers)
        self.num_stages = num_stages
        self.wait_slots = wait_slots

    def lowest_backprop_stage(self, worker: int, item_in_worker: int) -> int | None:
        config = self.workers[worker]
        for stage in range(self.num_stages):
            if config.backpropagates(item_in_worker, stage):
                return stage
        return None

    def in_flight_cap(self, worker: int, stage: int) -> int:
        return self.num_stages - stage


def replay_arrivals(num_workers: int, num_stages: int) -> int:
    """How many arrivals :func:`replay_staleness` replays for ``num_workers`` slots and ``num_stages``."""
    return min(MAX_ARRIVALS, max(MIN_ARRIVALS, ARRIVALS_PER_SLOT_STAGE * num_workers * num_stages))


def replay_staleness(
    workers: Sequence[WorkerConfig],
    forward_times: Sequence[float],
    backward_times: Sequence[float],
    arrival_interval: float,
    *,
    wait_slots: int = 1,
    arrivals: int | None = None,
) -> ExpectedStaleness:
    """Replay the configuration ``workers`` (see the module docstring) over ``arrivals`` arrivals (default
    :func:`replay_arrivals`) and return the mean staleness per stage after the first quarter."""
    p = len(forward_times)
    if len(backward_times) != p or any(len(w.accumulation) != p for w in workers):
        raise ConfigError(f"staleness replay needs per-stage times and worker settings for {p} stages")
    if not workers or not any(w.live for w in workers):
        raise ConfigError("staleness replay needs at least one live worker")
    if not (math.isfinite(arrival_interval) and arrival_interval > 0):
        raise ConfigError(f"arrival interval must be a positive number, got {arrival_interval}")
    total = replay_arrivals(len(workers), p) if arrivals is None else arrivals
    warm = total // 4
    rules = _Rules(workers, p, wait_slots)
    scheduler = Scheduler(rules)
    master = [0] * p
    replica = [[0] * p for _ in workers]
    reads: dict[tuple[int, int], int] = {}  # (item, stage) -> replica version read at its F
    buffers: list[list[list[int]]] = [[[] for _ in range(p)] for _ in workers]  # reads of pending gradients
    counted_from: dict[int, bool] = {}  # item -> arrived after the warm-up
    sums = [0.0] * p
    counts = [0] * p
    admitted_after_warm = 0
    admitted = [0] * len(workers)
    heap: list[tuple[float, int, int, Action | None]] = []
    order = itertools.count()

    def poke(worker: int, stage: int, now: float) -> None:
        action = scheduler.next_action(worker, stage)
        if action is None:
            return
        scheduler.start(action)
        duration = forward_times[stage] if action.kind is Kind.F else backward_times[stage]
        if action.kind is Kind.B and workers[worker].recompute:
            duration += forward_times[stage]
        heapq.heappush(heap, (now + duration, 0, next(order), action))

    heapq.heappush(heap, (0.0, 1, next(order), None))
    arrival = 0
    while heap:
        now, _, _, action = heapq.heappop(heap)
        if action is None:
            item, arrival = arrival, arrival + 1
            if arrival < total:
                heapq.heappush(heap, (arrival * arrival_interval, 1, next(order), None))
            n = item % len(workers)
            if not workers[n].live:
                continue
            lowest = rules.lowest_backprop_stage(n, admitted[n])
            if lowest is None:
                admitted[n] += 1
                continue
            if not scheduler.can_admit(n):
                continue  # busy: skipped, the worker's counter does not move
            admitted[n] += 1
            counted_from[item] = item >= warm
            admitted_after_warm += int(item >= warm)
            scheduler.admit(n, item, lowest)
            poke(n, 0, now)
            continue
        n, j, item = action.worker, action.stage, action.item
        if action.kind is Kind.F:
            reads[item, j] = replica[n][j]
        elif j >= scheduler.lowest(item):
            buffers[n][j].append(reads.pop((item, j)))
            if len(buffers[n][j]) >= workers[n].accumulation[j]:
                if counted_from[item]:
                    sums[j] += sum(master[j] - r for r in buffers[n][j])
                    counts[j] += len(buffers[n][j])
                buffers[n][j].clear()
                master[j] += 1
                replica[n][j] = master[j]
            if j == scheduler.lowest(item):
                del counted_from[item]
                for below in range(j):
                    reads.pop((item, below), None)
        for worker, stage in scheduler.finish(action):
            poke(worker, stage, now)
    mean = tuple(sums[j] / counts[j] if counts[j] else 0.0 for j in range(p))
    return ExpectedStaleness(mean, admitted_after_warm / max(1, total - warm))
