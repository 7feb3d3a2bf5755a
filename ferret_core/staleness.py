"""How stale a gradient can be when it is applied, derived from the plan (DESIGN §3.13).

Staleness τ of a gradient applied at stage i = number of master updates of stage i between the refresh
of the worker's replica it was computed on and its application. A worker's replica of stage i changes
only at that worker's own update points, one every q_n = c^a_{n,i} · period_{n,i} of its items
(period = the T3 back-propagation period, the LCM of §3.6), so:

* own_n: the worker's own updates between the item's forward and its backward at stage i: at most
  P−1−i older items are in flight there (the 1F1B cap), and under T3 every one of them may be
  back-propagated at i — an item that is not leaves the stage's in-flight set at its last backward
  higher up, which can come before an older back-propagated item's backward at i, so the items in
  flight need not be consecutive and T3's period does not thin them (the executed traces of random
  T3 plans reached this; ``tests/unit/test_staleness_bound.py``) — applied every c^a:
  ⌈(P−1−i) / c^a⌉ (with c^a = 1: PipeDream's P−1−i);
* the window between the refresh the gradient read and its application spans at most
  L_n = (own_n + 1) · q_n of the worker's item periods (the replica may be one refresh interval old at
  the forward, and own_n more refreshes happen before the backward);
* every other live worker m updates at most ⌈L_n / q_m⌉ + 1 times in that window (all workers receive
  one item per N arrivals; +1 for phase misalignment).

bound_i = max over live n of own_n + Σ_{m ≠ n} (⌈L_n / q_m⌉ + 1). It grows with N (DESIGN §3.13's
simulation: 10 at stage 0 for P = 4, N = 3). The bound sizes the Iter-Fisher delta ring
(:func:`ring_capacity`) and the cost model counts that ring with the same function. One worker's executed
staleness never exceeds it; with several, the others' term assumes each worker's items come one per N
arrivals, and a worker working off a backlog in its admission queue can update more often in the window
(docs/planner.md reading 5): such a gradient is compensated with the deltas the ring holds and counted as
truncated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ferret_core.plan import Plan, WorkerConfig


def own_updates_in_flight(worker: WorkerConfig, stage: int, num_stages: int) -> int:
    """Updates of ``stage`` by the worker itself while one of its back-propagated items is in flight: the
    older items in flight there, each of which may be back-propagated (module docstring), every c^a."""
    older_backprops = num_stages - 1 - stage
    return math.ceil(older_backprops / worker.accumulation[stage])


def refresh_interval(worker: WorkerConfig, stage: int) -> int:
    """q_n: the worker's items between two of its own updates (and replica refreshes) of ``stage``."""
    return worker.accumulation[stage] * worker.backprop_period(stage)


def refresh_window(worker: WorkerConfig, stage: int, num_stages: int) -> int:
    """L_n: item periods between the refresh a gradient read and the gradient's application."""
    return (own_updates_in_flight(worker, stage, num_stages) + 1) * refresh_interval(worker, stage)


def updates_during(worker: WorkerConfig, stage: int, window: int) -> int:
    """Most updates of ``stage`` that ``worker`` makes in ``window`` item periods."""
    return math.ceil(window / refresh_interval(worker, stage)) + 1


def bound_for_workers(workers: Sequence[WorkerConfig], stage: int, num_stages: int) -> int:
    """max over live n of own_n + Σ_{m ≠ n live} (⌈L_n / q_m⌉ + 1)."""
    live = [w for w in workers if w.live]
    worst = 0
    for worker in live:
        window = refresh_window(worker, stage, num_stages)
        others = sum(updates_during(o, stage, window) for o in live if o.index != worker.index)
        worst = max(worst, own_updates_in_flight(worker, stage, num_stages) + others)
    return worst


def staleness_bound(plan: Plan, stage: int) -> int:
    """Upper bound of τ at ``stage`` over every live worker of ``plan``."""
    return bound_for_workers(plan.workers, stage, plan.num_stages)


def ring_capacity(plan: Plan, stage: int) -> int:
    """Deltas of ``stage`` the Iter-Fisher ring must keep: the staleness bound (DESIGN §3.4)."""
    return staleness_bound(plan, stage)
