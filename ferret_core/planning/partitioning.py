"""Alg. 3's partition candidates (sub-problem 2): stage-time caps and the greedy cut for each cap.

Readings (DESIGN §3.5): a stage's time is t̂^f + t̂^b (the listing's t̂^f + t̂^f is a typo); candidate caps
t^c are the sums over consecutive units that are ≥ the slowest single unit (the listing's ``<`` is
inverted: no stage can be faster than its slowest unit); ``L.append(i)`` makes unit i the first unit of a
new stage. Several caps can give the same partition; each partition is searched once.
"""

from __future__ import annotations

from ferret_core.plan import Partition
from ferret_core.profile import ModelProfile

# Relative slack when comparing a running stage sum with a cap, so float noise in summing the same
# units in another order cannot split a stage that fits exactly.
_CAP_SLACK = 1e-12


def candidate_caps(profile: ModelProfile) -> list[float]:
    """Sorted distinct sums of t̂^f + t̂^b over consecutive units that are ≥ max_i (t̂_i^f + t̂_i^b)."""
    times = [layer.t_fb for layer in profile.layers]
    slowest = max(times)
    caps: set[float] = set()
    for start in range(len(times)):
        total = 0.0
        for end in range(start, len(times)):
            total += times[end]
            if total >= slowest:
                caps.add(total)
    return sorted(caps)


def partition_for_cap(profile: ModelProfile, cap: float) -> Partition:
    """Fewest stages whose time t̂^f + t̂^b stays ≤ ``cap``, grouping consecutive units greedily."""
    boundaries = [0]
    running = 0.0
    for index, layer in enumerate(profile.layers):
        running += layer.t_fb
        if running > cap * (1.0 + _CAP_SLACK) and index > boundaries[-1]:
            boundaries.append(index)
            running = layer.t_fb
    boundaries.append(profile.num_units)
    return Partition(tuple(boundaries))


def candidate_partitions(profile: ModelProfile) -> list[tuple[float, Partition]]:
    """(cap, partition) for every distinct partition, in increasing cap order (first cap kept)."""
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[float, Partition]] = []
    for cap in candidate_caps(profile):
        partition = partition_for_cap(profile, cap)
        if partition.boundaries not in seen:
            seen.add(partition.boundaries)
            out.append((cap, partition))
    return out
