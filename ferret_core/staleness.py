"""How stale a gradient can be when it is applied, derived from the plan (DESIGN §3.13).

Staleness τ of a gradient applied at stage i = number of master updates of stage i between the refresh
of the worker's replica it was computed on and its application.

* The worker's own updates: in 1F1B the P−1−i older items of the same worker are in flight at stage i
  when an item enters it; only those back-propagated at stage i (one in ``backprop_period``, T3) give
  gradients, and they are applied every c^a of them (T2): ⌈⌊(P−1−i)/period⌋ / c^a⌉. With one worker,
  c^a = 1 and no omission this is PipeDream's P−1−i.
* Every other live worker n': during the item's residence at stage i (at most P−i of n''s item periods,
  plus one for phase misalignment) n' back-propagates at most ⌈(P−i+1)/period⌉ items there and updates
  ⌈that / c^a⌉ times. So the bound grows with N (≈ N·⌈(P−i)/c^a⌉; DESIGN §3.13's simulation: 10 at
  stage 0 for P = 4, N = 3).

The bound sizes the Iter-Fisher delta ring (:func:`ring_capacity`) and is what validators check executed
traces against. The cost model counts the ring with the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ferret_core.plan import Plan, WorkerConfig


def own_updates_in_flight(worker: WorkerConfig, stage: int, num_stages: int) -> int:
    """Updates of ``stage`` by the worker itself while one of its back-propagated items is in flight."""
    older_backprops = (num_stages - 1 - stage) // worker.backprop_period(stage)
    return math.ceil(older_backprops / worker.accumulation[stage])


def other_updates_in_flight(worker: WorkerConfig, stage: int, num_stages: int) -> int:
    """Updates of ``stage`` by ``worker`` during another worker's item residence at that stage."""
    backprops = math.ceil((num_stages - stage + 1) / worker.backprop_period(stage))
    return math.ceil(backprops / worker.accumulation[stage])


def bound_for_workers(workers: Sequence[WorkerConfig], stage: int, num_stages: int) -> int:
    """max over live n of own(n) + Σ_{n' ≠ n live} other(n')."""
    live = [w for w in workers if w.live]
    if not live:
        return 0
    others = [other_updates_in_flight(w, stage, num_stages) for w in live]
    total_other = sum(others)
    return max(
        own_updates_in_flight(w, stage, num_stages) + total_other - other for w, other in zip(live, others, strict=True)
    )


def staleness_bound(plan: Plan, stage: int) -> int:
    """Upper bound of τ at ``stage`` over every live worker of ``plan``."""
    return bound_for_workers(plan.workers, stage, plan.num_stages)


def ring_capacity(plan: Plan, stage: int) -> int:
    """Deltas of ``stage`` the Iter-Fisher ring must keep: the staleness bound (DESIGN §3.4)."""
    return staleness_bound(plan, stage)
