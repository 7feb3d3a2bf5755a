"""What one worker's in-flight items hold: activations by stage over its 1F1B schedule (DESIGN §3.8, §3.13).

The engine's workers never share items, so what worker n's items hold depends only on its own
configuration (T1 c^r_n and T3 c^o_{n,·}; T2 changes no schedule), the stage times and the interval
N·t^d between its arrivals. Per item the engine (:mod:`ferret_core.engine.pipeline`) references

* its stage input before each F (the sample before stage 0, then each stage's output);
* for every stage j it is back-propagated at, a graph from F(j) to B(j): the stage's input and output
  storages and autograd's other saved tensors (``internal``) — or, under T1, only the stage input from
  F(j) to B(j), plus one recomputed graph (with a fresh output) from R(j) to B(j);
* the gradient of stage j's output from B(j+1) to B(j); its label (8 bytes).

Storages two holders share (a stage's output is the next stage's input) are counted once. Two bounds:

* :func:`replay_worker` (``in_flight="schedule"``) runs the engine's own
  :class:`~ferret_core.schedule.scheduler.Scheduler` on the worker's arrivals with the profiled stage
  times, as the virtual clock does, and takes the largest total after any F, R or B. The virtual clock
  is deterministic and its arrivals periodic, so the replay runs until the worker's state at an arrival
  repeats (same items at the same progress, same remaining times, same place in T3's cycle): from there
  on every cycle repeats, and the peak is exact for that clock.
* :func:`cap_residency` (``in_flight="cap"``) holds for any timing (the wall clock): at most P − j items
  in flight at stage j (the scheduler's 1F1B cap) — all of them possibly back-propagated at j, whatever
  T3 says, since an omitted item may finish below j before an older one does — each holding at most its
  graphs, one stage input and one output gradient, plus ``wait_slots`` admitted items waiting with their
  sample; under T1, one recomputed graph per stage (executors run concurrently on the wall clock).

Both also report K_j, the most items back-propagated at j in flight there at once, which bounds the
replica versions the worker keeps (:mod:`ferret_core.planning.memory_model`). Units: elements of the profile's
dtype (the label counts 8 bytes).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from ferret_core.errors import ConfigError
from ferret_core.plan import backprop_period
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.scheduler import Scheduler

LABEL_BYTES = 8  # an int64 class index per item (InFlightItem.target)
WARM_ARRIVALS_PER_STAGE = 8  # the replay's horizon: 8·P items taken to fill and settle the pipeline,
CYCLES = 2  # plus two of T3's cycles of the worker's items (LCM of the back-propagation periods)
MAX_HORIZON = 1024


@dataclass(frozen=True)
class StageSizes:
    """Per-stage element counts of one item (from :class:`~ferret_core.planning.cost_model.StageGeometry`)."""

    sample: int  # the model's input
    outputs: tuple[int, ...]  # stage j's output (stage j+1's input)
    internal: tuple[int, ...]  # a graph's saved storages other than its input and output
    label: int = 2  # LABEL_BYTES in elements of the dtype (float32: 2)

    @property
    def num_stages(self) -> int:
        return len(self.outputs)

    def stage_input(self, stage: int) -> int:
        return self.sample if stage == 0 else self.outputs[stage - 1]


@dataclass(frozen=True)
class Residency:
    """What one worker holds in flight: ``peak`` elements of activations at its worst sample point, and
    ``backprop_in_flight[j]`` = K_j, the most items back-propagated at j in flight there at once.
    ``exact``: from a replay that reached a repeating state (else: a horizon or the cap bound).
    ``recompute_graph`` (replay, T1): the largest graph a recompute (R) builds, held only from the R to
    its B and left out of ``peak``: the virtual clock runs one action at a time, so one such graph of one
    worker exists at any sample (the memory model adds the largest once)."""

    peak: int
    backprop_in_flight: tuple[int, ...]
    exact: bool
    recompute_graph: int = 0
    sampled_peak: int = 0  # the largest total at a sample, a recomputed graph included (one worker alone)


class _OneWorker:
    """Ferret's schedule rules (:class:`~ferret_core.schedule.scheduler.PlanRules`) for one worker."""

    num_workers = 1

    def __init__(self, num_stages: int, omission: tuple[int, ...], wait_slots: int) -> None:
        self.num_stages = num_stages
        self.wait_slots = wait_slots
        self.periods = tuple(backprop_period(omission, j) for j in range(num_stages))

    def lowest_backprop_stage(self, worker: int, item_in_worker: int) -> int | None:
        for stage, period in enumerate(self.periods):
            if item_in_worker % period == 0:
                return stage
        return None

    def in_flight_cap(self, worker: int, stage: int) -> int:
        return self.num_stages - stage


def cap_residency(sizes: StageSizes, recompute: bool, *, wait_slots: int = 1) -> Residency:
    """A bound on one worker's activations that holds for any action durations (see the module docstring)."""
    p = sizes.num_stages
    held = sum(cap_stage_activations(sizes, recompute, wait_slots=wait_slots))
    return Residency(held, tuple(p - j for j in range(p)), exact=False)


def cap_stage_activations(sizes: StageSizes, recompute: bool, *, wait_slots: int = 1) -> tuple[int, ...]:
    """:func:`cap_residency`'s bound by the stage whose executor holds each term (they sum to its ``peak``):
    stage j's P − j graphs (under T1: its kept inputs and one recomputed graph), one stage input, one
    output gradient and one label; the ``wait_slots`` admitted items wait at stage 0. Where a stage's
    memory lives apart from the others' (stages owned by several hosts), this is its share."""
    p = sizes.num_stages
    largest_input = max(sizes.stage_input(j) for j in range(p))
    largest_output = max(sizes.outputs[:-1], default=0)  # an output gradient (never of the last stage)
    per_stage = []
    for j in range(p):
        in_flight = p - j
        if recompute:
            held = in_flight * sizes.stage_input(j) + sizes.internal[j] + sizes.outputs[j]
        else:
            held = in_flight * (sizes.internal[j] + sizes.outputs[j])
        per_stage.append(held + largest_input + largest_output + sizes.label)
    per_stage[0] += wait_slots * (sizes.sample + sizes.label)
    return tuple(per_stage)


class _Held:
    """Storages referenced per item, counted once each (a reference count per storage)."""

    def __init__(self) -> None:
        self.total = 0
        self._refs: dict[tuple[int, str, int], list[int]] = {}

    def ref(self, item: int, kind: str, stage: int, size: int) -> None:
        entry = self._refs.get((item, kind, stage))
        if entry is None:
            self._refs[(item, kind, stage)] = [1, size]
            self.total += size
        else:
            entry[0] += 1

    def unref(self, item: int, kind: str, stage: int) -> None:
        key = (item, kind, stage)
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.total -= entry[1]
            del self._refs[key]


def replay_worker(
    sizes: StageSizes,
    forward_times: tuple[float, ...],
    backward_times: tuple[float, ...],
    recompute: bool,
    omission: tuple[int, ...],
    arrival_period: float,
    *,
    wait_slots: int = 1,
    arrivals: int | None = None,
) -> Residency:
    """Replay one worker's schedule on the virtual clock (see the module docstring): arrivals every
    ``arrival_period`` (= N·t^d), F taking ``forward_times[j]``, B taking ``backward_times[j]`` (plus the
    forward under T1), until the state repeats or the horizon (8·P items taken plus two of T3's cycles, at
    most :data:`MAX_HORIZON`; items skipped as busy do not count) is reached. ``arrivals`` replays
    exactly that many arrivals instead (what a stream of that length does; used by tests)."""
    p = sizes.num_stages
    if not (len(forward_times) == len(backward_times) == len(omission) == p):
        raise ConfigError(f"replay needs per-stage times and omissions for {p} stages")
    if not (math.isfinite(arrival_period) and arrival_period > 0):
        raise ConfigError(f"arrival period must be a positive number, got {arrival_period}")
    rules = _OneWorker(p, omission, wait_slots)
    cycle = math.lcm(*rules.periods)
    horizon = min(MAX_HORIZON, WARM_ARRIVALS_PER_STAGE * p + CYCLES * cycle)  # in items taken (busy ones do not count)
    scheduler = Scheduler(rules)
    held = _Held()
    heap: list[tuple[float, int, int, Action | None]] = []
    order = itertools.count()
    lowest: dict[int, int] = {}
    running: dict[int, float] = {}  # item → end of its running action (for the repetition test)
    progress: dict[int, int] = {}  # item → actions completed
    in_flight = [0] * p
    most = [0] * p
    peak = 0
    regraph = 0
    sampled = 0
    seen: dict[tuple[tuple[int, int, int, int], ...], int] = {}
    scale = 1e9 / arrival_period  # times compared in units of 1e-9 arrival periods
    m = 0  # the worker's item counter (T3's alignment), as Pipeline.dispatch counts it

    def poke(stage: int, now: float) -> None:
        action = scheduler.next_action(0, stage)
        if action is None:
            return
        scheduler.start(action)
        duration = forward_times[stage] if action.kind is Kind.F else backward_times[stage]
        if action.kind is Kind.B and recompute:
            duration += forward_times[stage]
        running[action.item] = now + duration
        heapq.heappush(heap, (now + duration, 0, next(order), action))

    def done(*, exact: bool) -> Residency:
        return Residency(peak, tuple(most), exact, recompute_graph=regraph, sampled_peak=max(peak, sampled))

    arrival = 0
    heapq.heappush(heap, (0.0, 1, next(order), None))
    while heap:
        now, is_arrival, _, action = heapq.heappop(heap)
        if is_arrival:
            if arrivals is None and m % cycle == 0:  # compare states at the same place in T3's cycle
                state = tuple(
                    sorted(
                        (arrival - i, lowest[i], progress[i], round((running.get(i, now) - now) * scale))
                        for i in lowest
                    )
                )
                if state in seen:  # everything from here on repeats what followed the earlier arrival
                    return done(exact=True)
                seen[state] = arrival
            if arrivals is None and m >= horizon:
                return done(exact=False)
            if arrivals is not None and arrival >= arrivals:
                continue  # the stream has ended: drain what is in flight
            heapq.heappush(heap, ((arrival + 1) * arrival_period, 1, next(order), None))
            item, arrival = arrival, arrival + 1
            k = rules.lowest_backprop_stage(0, m)
            if k is None:
                m += 1
                continue
            if not scheduler.can_admit(0):
                continue  # busy: skipped, the counter m does not move
            m += 1
            lowest[item], progress[item] = k, 0
            held.ref(item, "label", 0, sizes.label)
            held.ref(item, "b", -1, sizes.sample)  # inputs[0]: the sample
            scheduler.admit(0, item, k)
            poke(0, now)
            continue
        assert action is not None
        i, j, k = action.item, action.stage, lowest[action.item]
        running.pop(i, None)
        progress[i] += 1
        if action.kind is Kind.F:
            if j >= k:
                in_flight[j] += 1
                most[j] = max(most[j], in_flight[j])
            if j >= k and not recompute:
                held.ref(i, "g", j, sizes.internal[j])  # the graph: internal tensors,
                held.ref(i, "b", j - 1, 0)  # its input (taken over from inputs[j]),
                held.ref(i, "b", j, sizes.outputs[j])  # its output
                held.unref(i, "b", j - 1)  # inputs[j] = None
                if j + 1 < p:
                    held.ref(i, "b", j, 0)  # inputs[j+1] = the output
            elif j >= k:  # T1: the input stays for the recompute; the no-grad output goes on
                if j + 1 < p:
                    held.ref(i, "b", j, sizes.outputs[j])
            else:  # not back-propagated here: input released, output goes on
                held.unref(i, "b", j - 1)
                if j + 1 < p:
                    held.ref(i, "b", j, sizes.outputs[j])
            peak = max(peak, held.total)
        else:
            if recompute:  # R: a graph on the kept input with a fresh output, sampled, then B
                peak = max(peak, held.total)
                regraph = max(regraph, sizes.internal[j] + sizes.outputs[j])
                sampled = max(sampled, held.total + sizes.internal[j] + sizes.outputs[j])
                held.ref(i, "g", j, 0)  # the B below releases it
            else:
                held.unref(i, "b", j)  # the graph's output
            held.unref(i, "g", j)
            held.unref(i, "b", j - 1)  # the graph's input (T1: the kept input)
            if j < p - 1:
                held.unref(i, "go", j)
            if j > k:
                held.ref(i, "go", j - 1, sizes.outputs[j - 1])
            in_flight[j] -= 1
            peak = max(peak, held.total)
            if j == k:
                held.unref(i, "label", 0)
                del lowest[i], progress[i]
        for _, stage in scheduler.finish(action):
            poke(stage, now)
    return done(exact=True)
