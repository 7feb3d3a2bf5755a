"""Alg. 2 (iterative configuration search, sub-problem 1) for one partition and one c^r.

The greedy starts from N = ⌈(t^f + t^b + c^r t^f)/t^d⌉ live workers with c^a = 1, c^o = 0 and applies
one step at a time (DESIGN §3.7):

* S2 (T2) at stage j ≤ P−2 of worker n, when c^o_{n,j} = 0: c^a += Δc^a with
  Δc^a = ⌈(P−j−1)/(⌈(P−j−1)/c^a⌉ − 1)⌉ − c^a (eq. dsvre-ga); when ⌈(P−j−1)/c^a⌉ = 1 it is infinite and
* S3 (T3) replaces it: c^a = 1, c^o = P−1−j (eq. dsvre-bpo);
* S4 (T4) removes worker n once c^o_{n,j} ≠ 0 for every j ∈ [0, P−1) — never the last live worker.

Each step's ΔR and ΔM come from re-evaluating the changed worker's term (DESIGN §3.12; ΔM also
re-evaluates the shared compensator ring, which depends on every worker). The step with the most
memory saved per unit of adaptation rate lost is taken (a step with ΔR = 0 first); ties go to the first
in the order worker n ascending, stages j = 0..P−2, then S4. Steps that save nothing (possible once the
extras count accumulation buffers) are taken only when no step saves memory, least costly first, so the
search can still reach the configurations they unlock.

Instead of stopping at the budget, :func:`search_path` records the whole greedy path down to the
fully reduced configuration. The path does not depend on the budget, so a plan for budget M is the first
point with bytes ≤ M, the minimum feasible memory is the path's minimum, and more budget can never give a
lower R_F.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from ferret_core.plan import PlanStep, WorkerConfig
from ferret_core.planning.cost_model import RateModel, paper_worker_elements
from ferret_core.planning.memory_model import MemoryModel
from ferret_core.staleness import own_updates_in_flight, refresh_interval, refresh_window


@dataclass(frozen=True)
class PathPoint:
    """The configuration after ``steps_taken`` steps of the greedy path."""

    steps_taken: int
    rate: float
    bytes: int
    paper_elements: int


@dataclass(frozen=True)
class SearchPath:
    """The whole greedy path of Alg. 2 for one partition and one c^r."""

    recompute: bool
    initial: tuple[WorkerConfig, ...]
    steps: tuple[PlanStep, ...]
    changes: tuple[WorkerConfig, ...]  # the changed worker after each step
    points: tuple[PathPoint, ...]  # len(steps) + 1

    def first_within(self, budget: int | None) -> PathPoint | None:
        """The first point whose bytes fit ``budget`` (None: unconstrained → the initial point)."""
        if budget is None:
            return self.points[0]
        for point in self.points:
            if point.bytes <= budget:
                return point
        return None

    @property
    def min_bytes(self) -> int:
        return min(point.bytes for point in self.points)

    def workers_at(self, point: PathPoint) -> tuple[WorkerConfig, ...]:
        workers = list(self.initial)
        for changed in self.changes[: point.steps_taken]:
            workers[changed.index] = changed
        return tuple(workers)


def initial_workers(num_workers: int, num_stages: int, recompute: bool) -> tuple[WorkerConfig, ...]:
    """Alg. 2 line 3: c^d_n = n, c^r_n = c^r, c^a = 1, c^o = 0."""
    ones, zeros = (1,) * num_stages, (0,) * num_stages
    return tuple(WorkerConfig(n, True, recompute, ones, zeros) for n in range(num_workers))


def accumulation_increment(num_stages: int, stage: int, accumulation: int) -> int | None:
    """Δc^a of S2 (eq. dsvre-ga); None where it is infinite (the trigger for S3)."""
    versions = math.ceil((num_stages - stage - 1) / accumulation)
    if versions <= 1:
        return None
    return math.ceil((num_stages - stage - 1) / (versions - 1)) - accumulation


def candidate_changes(worker: WorkerConfig, num_stages: int, live_count: int) -> list[tuple[PlanStep, WorkerConfig]]:
    """S2/S3 per stage j = 0..P−2 (when c^o = 0), then S4 — the tie-break order of DESIGN §3.7."""
    out: list[tuple[PlanStep, WorkerConfig]] = []
    for j in range(num_stages - 1):
        if worker.omission[j] != 0:
            continue
        a = worker.accumulation[j]
        delta = accumulation_increment(num_stages, j, a)
        if delta is not None:
            acc = _with(worker.accumulation, j, a + delta)
            step = PlanStep("S2", worker.index, j, f"T2: accumulate {a}→{a + delta} gradients at stage {j}", 0.0, 0)
            out.append((step, replace(worker, accumulation=acc)))
        else:
            omit = num_stages - 1 - j
            acc = _with(worker.accumulation, j, 1)
            om = _with(worker.omission, j, omit)
            detail = f"T3: back-propagate stage {j} for 1 item in {omit + 1} (c^o = {omit})"
            step = PlanStep("S3", worker.index, j, detail, 0.0, 0)
            out.append((step, replace(worker, accumulation=acc, omission=om)))
    if live_count > 1 and all(o != 0 for o in worker.omission[: num_stages - 1]):
        step = PlanStep("S4", worker.index, None, f"T4: remove worker {worker.index}", 0.0, 0)
        out.append((step, replace(worker, live=False)))
    return out


def _with(values: tuple[int, ...], index: int, value: int) -> tuple[int, ...]:
    return (*values[:index], value, *values[index + 1 :])


@dataclass
class _Candidate:
    step: PlanStep
    worker: WorkerConfig
    rate: float
    elements: int


def search_path(rate_model: RateModel, memory_model: MemoryModel, num_workers: int, recompute: bool) -> SearchPath:
    """Run Alg. 2's greedy from the initial configuration until no step is left."""
    geometry = rate_model.geometry
    p = geometry.num_stages
    unit = memory_model.settings.unit_bytes
    workers = list(initial_workers(num_workers, p, recompute))
    rates = [rate_model.worker_rate(w.recompute, w.accumulation, w.omission) for w in workers]
    elems = [memory_model.worker_elements(w) for w in workers]
    paper = [paper_worker_elements(geometry, w.recompute, w.accumulation, w.omission) for w in workers]
    ring = _RingAccount(memory_model, workers) if memory_model.has_compensator_state else None
    fixed = memory_model.fixed_elements + memory_model.transient_elements(recompute)  # c^r is the path's
    shared = fixed + (ring.elements if ring else 0)
    cache: dict[int, list[_Candidate]] = {}
    steps: list[PlanStep] = []
    changes: list[WorkerConfig] = []
    points = [PathPoint(0, sum(rates), (sum(elems) + shared) * unit, sum(paper))]

    while True:
        live_count = sum(1 for w in workers if w.live)
        best: tuple[tuple[float, ...], _Candidate, int] | None = None
        seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        for worker in workers:
            if not worker.live:
                continue
            # Workers with the same configuration have identical candidates (same ΔR, same ΔM, the ring
            # included) and ties go to the lowest index, so the first of them stands for all.
            key_config = (worker.accumulation, worker.omission)
            if key_config in seen:
                continue
            seen.add(key_config)
            candidates = cache.get(worker.index)
            if candidates is None or any(c.step.kind == "S4" for c in candidates) != (
                live_count > 1 and _s4_ready(worker, p)
            ):
                candidates = [
                    _Candidate(
                        step,
                        changed,
                        0.0
                        if not changed.live
                        else rate_model.worker_rate(changed.recompute, changed.accumulation, changed.omission),
                        memory_model.worker_elements(changed),
                    )
                    for step, changed in candidate_changes(worker, p, live_count)
                ]
                cache[worker.index] = candidates
            for cand in candidates:
                n = worker.index
                new_shared = fixed + ring.elements_with(cand.worker) if ring else shared
                d_elements = cand.elements - elems[n] + new_shared - shared
                d_rate = cand.rate - rates[n]
                key = _rank(d_rate, d_elements)
                if best is None or key > best[0]:
                    best = (key, cand, new_shared)
        if best is None:
            break
        _, cand, new_shared = best
        n = cand.worker.index
        d_rate = cand.rate - rates[n]
        d_bytes = (cand.elements - elems[n] + new_shared - shared) * unit
        workers[n] = cand.worker
        rates[n], elems[n], shared = cand.rate, cand.elements, new_shared
        paper[n] = (
            paper_worker_elements(geometry, cand.worker.recompute, cand.worker.accumulation, cand.worker.omission)
            if cand.worker.live
            else 0
        )
        cache.pop(n, None)
        if ring is not None:
            ring.apply(cand.worker)
        steps.append(replace(cand.step, delta_rate=d_rate, delta_bytes=d_bytes))
        changes.append(cand.worker)
        points.append(PathPoint(len(steps), sum(rates), (sum(elems) + shared) * unit, sum(paper)))

    initial = initial_workers(num_workers, p, recompute)
    return SearchPath(recompute, initial, tuple(steps), tuple(changes), tuple(points))


def _s4_ready(worker: WorkerConfig, num_stages: int) -> bool:
    return all(o != 0 for o in worker.omission[: num_stages - 1])


@lru_cache(maxsize=65536)
def _ring_terms(
    num_stages: int, accumulation: tuple[int, ...], omission: tuple[int, ...]
) -> tuple[tuple[int, int, int], ...]:
    """(own updates in flight, refresh interval q, refresh window L) per stage for a worker
    configuration (cached: the greedy revisits the same few configurations many times)."""
    worker = WorkerConfig(0, True, False, accumulation, omission)
    return tuple(
        (
            own_updates_in_flight(worker, i, num_stages),
            refresh_interval(worker, i),
            refresh_window(worker, i, num_stages),
        )
        for i in range(num_stages)
    )


class _RingAccount:
    """The compensators' elements for the current workers, and with one worker changed.

    Per stage i they depend on bound_i = max_n own_n + Σ_{m≠n} (⌈L_n/q_m⌉ + 1)
    (:func:`ferret_core.staleness.bound_for_workers`): nothing at bound_i = 0, else the moments, the
    accumulator and (Alg. 1) a ring of bound_i deltas of |w_i|
    (:meth:`~ferret_core.planning.memory_model.MemoryModel.stage_compensator_elements`). Keeping, per stage
    and worker n, the sum S_n = Σ_{m≠n} ⌈L_n/q_m⌉ prices a candidate that changes one worker in O(N) per changed stage.
    """

    def __init__(self, memory_model: MemoryModel, workers: Sequence[WorkerConfig]) -> None:
        self.model = memory_model
        self.p = memory_model.geometry.num_stages
        self.terms = {w.index: _ring_terms(self.p, w.accumulation, w.omission) for w in workers if w.live}
        self.sums: list[dict[int, int]] = []
        self.stage_elements: list[int] = []
        count = len(self.terms)
        for i in range(self.p):
            sums = {
                n: sum(-(-t[i][2] // u[i][1]) for m, u in self.terms.items() if m != n) for n, t in self.terms.items()
            }
            self.sums.append(sums)
            bound = max((self.terms[n][i][0] + s for n, s in sums.items()), default=None)
            self.stage_elements.append(0 if bound is None else self._stage(i, bound + count - 1, count))
        self.elements = sum(self.stage_elements)

    def elements_with(self, changed: WorkerConfig) -> int:
        k = changed.index
        old = self.terms[k]
        new = _ring_terms(self.p, changed.accumulation, changed.omission) if changed.live else None
        count = len(self.terms) - (0 if new is not None else 1)
        total = self.elements
        for i in range(self.p):
            if new is not None and new[i] == old[i]:
                continue  # stage i's bound depends only on the workers' terms at stage i
            best: int | None = None
            q_old = old[i][1]
            for n, s in self.sums[i].items():
                if n == k:
                    continue
                # n's sum with worker k's new refresh interval (or without k once removed)
                window = self.terms[n][i][2]
                s_new = s - (-(-window // q_old)) + (-(-window // new[i][1]) if new is not None else 0)
                value = self.terms[n][i][0] + s_new
                best = value if best is None or value > best else best
            if new is not None:
                s_k = sum(-(-new[i][2] // self.terms[m][i][1]) for m in self.terms if m != k)
                value = new[i][0] + s_k
                best = value if best is None or value > best else best
            bound = 0 if best is None else best + count - 1
            total += self._stage(i, bound, count) - self.stage_elements[i]
        return total

    def apply(self, changed: WorkerConfig) -> None:
        """Take the step: worker ``changed.index`` now has ``changed``'s configuration (O(N) per stage)."""
        k = changed.index
        old = self.terms.pop(k)
        new = _ring_terms(self.p, changed.accumulation, changed.omission) if changed.live else None
        if new is not None:
            self.terms[k] = new
        count = len(self.terms)
        for i in range(self.p):
            if new is not None and new[i] == old[i]:
                continue
            sums = self.sums[i]
            sums.pop(k)
            for n in sums:
                window = self.terms[n][i][2]
                sums[n] += (-(-window // new[i][1]) if new is not None else 0) - (-(-window // old[i][1]))
            if new is not None:
                sums[k] = sum(-(-new[i][2] // self.terms[m][i][1]) for m in self.terms if m != k)
            bound = max((self.terms[n][i][0] + s for n, s in sums.items()), default=None)
            self.stage_elements[i] = 0 if bound is None else self._stage(i, bound + count - 1, count)
        self.elements = sum(self.stage_elements)

    def _stage(self, stage: int, bound: int, live: int) -> int:
        return self.model.stage_compensator_elements(stage, bound, live)


def _rank(d_rate: float, d_elements: int) -> tuple[float, ...]:
    """Larger is better. Saving steps by memory saved per unit of R_F lost (ΔR = 0 ⇒ infinite);
    then steps that save nothing, least memory added first, then least R_F lost."""
    if d_elements < 0:
        lost = -d_rate
        return (1.0, math.inf if lost <= 0.0 else -d_elements / lost)
    return (0.0, -float(d_elements), d_rate)
