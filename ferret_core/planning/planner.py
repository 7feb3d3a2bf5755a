"""The planner: Alg. 3 (brute-force planning) over Alg. 2 (iterative configuration search).

``Planner(profile, settings)`` enumerates the candidate partitions once and, lazily, the greedy path of
each (partition, c^r); ``plan(budget)`` then picks, over all of them, the configuration with the highest
R_F whose bytes fit the budget (Alg. 2's ``search`` takes the better of c^r = 0 and 1; Alg. 3 the best
partition). Alg. 3 keeps a partition only if its R_F is strictly higher (``R > R*``), so the paper leaves
equal R_F undecided; we break ties toward less memory: fewer bytes, then fewer stages, fewer live
workers, c^r = 0 (:meth:`Planner.options`, ``docs/planner.md`` reading 10).

**A stream one unsplit worker keeps up with.** Eq. ferret-svre's R_F counts 1/(t^f + t^b + c^r t^f) items
per second per worker, the pipeline's pace, whatever the stream brings; when Σ_i (t̂_i^f + t̂_i^b) ≤ t^d
(one worker, one stage, no T1 trains every item as it arrives) a split pipeline's higher R_F is items
that never arrive. Then every configuration that trains every arriving item (all N workers live, no
back-propagation omission, N·t^d ≥ its worker time) reaches the most R_F the stream allows, and they tie:
the smallest of them is chosen (the tie rule above), which is one unsplit worker unless the budget
says otherwise. Configurations that skip items rank below them, by R_F.

Re-planning under a new budget reuses the paths, so the control plane can answer quickly. An infeasible
budget raises :class:`InfeasibleBudgetError` with the minimum feasible bytes over all partitions and c^r (DESIGN §3.7).

**Two objectives** (``PlannerSettings.objective``). ``rate`` (the default) is the paper's: the highest R_F.
``accuracy`` (ours) ranks by R_F discounted by the measured cost of staleness: each stage term of R_F times
d(τ̄_j), τ̄_j the mean staleness of the configuration's gradients at stage j on the virtual clock
(:mod:`~ferret_core.planning.expected_staleness`), d the cost (:mod:`~ferret_core.planning.staleness_cost`).
Fewer workers than Alg. 2's N only trade items for staleness, so under ``accuracy`` (with a non-zero cost)
each (partition, c^r) is also searched from every N' < N worker slots (its own greedy path); R_F is still
computed exactly as eq. ferret-svre says, and with the zero cost the ranking and candidates are the
rate objective's, so the plan is the same (a hypothesis property). ``docs/planner.md`` reading 13.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ferret_core.errors import ConfigError, InfeasibleBudgetError, InfeasibleHostBudgetError
from ferret_core.plan import Partition, Plan, PlanObjectives, WorkerConfig, backprop_period
from ferret_core.planning.cost_model import RateModel, StageGeometry, num_worker_slots
from ferret_core.planning.expected_staleness import ExpectedStaleness, replay_staleness
from ferret_core.planning.host_memory import HostBudget, host_bytes
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.partitioning import candidate_partitions
from ferret_core.planning.search import PathPoint, SearchPath, search_path
from ferret_core.planning.staleness_cost import StalenessCost
from ferret_core.profile import ModelProfile

OBJECTIVES: tuple[str, ...] = ("rate", "accuracy")
EVERY_SLOT_COUNT_UP_TO = 8  # the accuracy objective searches every N' ≤ this (then a halving ladder)


def default_decay(profile: ModelProfile) -> float:
    """c such that an item's value halves over one sequential forward and backward of the whole model
    (T = Σ_i t̂_i^f + t̂_i^b): c = ln 2 / T (DESIGN §3.9)."""
    return math.log(2.0) / profile.sequential_time


@dataclass(frozen=True)
class PlannerSettings:
    """What the planner needs besides the profile. ``None`` means the paper's default."""

    arrival_interval: float | None = None  # t^d in profile time units; None: max_i t̂_i^f
    decay: float | None = None  # c; None: ln 2 / Σ(t̂^f + t̂^b)
    memory: MemorySettings = field(default_factory=MemorySettings)
    max_workers: int | None = None  # cap N by the executors that exist (wall clock)
    max_stages: int | None = None  # cap P (the live trainer on CPU: docs/planner.md reading 11)
    recompute_options: tuple[bool, ...] = (False, True)
    # measured ÷ profiled time per item (reading 11, ours): the planner plans with profile.scaled(time_scale)
    time_scale: float = 1.0
    # seconds one stale gradient's compensation takes for the whole model, in the machine's time (reading 14,
    # ours): added to each stage's t^b, in proportion to its weights, in plans whose gradients can be stale
    # (N > 1 or P > 1); 0: not counted, as the paper's R_F does not
    compensation_time: float = 0.0
    # what the plan maximises: "rate" (R_F, the paper's) or "accuracy" (R_F discounted by staleness_cost)
    objective: str = "rate"
    staleness_cost: StalenessCost | None = None  # d(τ), measured; required by "accuracy"
    # several hosts (ours): every host's bytes within its budget too, stages placed as the trainer places them
    # (:mod:`~ferret_core.planning.host_memory`); needs the engine's ``cap`` byte model
    hosts: HostBudget | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.objective == "accuracy" and self.staleness_cost is None:
            raise ConfigError(
                "the accuracy objective needs a measured staleness cost (PlannerSettings.staleness_cost; the CLI "
                "calibrates one on the stream's head: --objective accuracy with --dataset or --staleness-cost FILE)"
            )
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ConfigError(f"time_scale (measured ÷ profiled time per item) must be > 0, got {self.time_scale}")
        if not (math.isfinite(self.compensation_time) and self.compensation_time >= 0):
            raise ConfigError(f"compensation_time must be >= 0 seconds, got {self.compensation_time}")
        if self.arrival_interval is not None and not (
            math.isfinite(self.arrival_interval) and self.arrival_interval > 0
        ):
            raise ConfigError(f"arrival interval must be a positive number of seconds, got {self.arrival_interval}")
        if self.decay is not None and not (math.isfinite(self.decay) and self.decay >= 0):
            raise ConfigError(f"decay constant c must be finite and >= 0, got {self.decay}")
        if self.max_workers is not None and self.max_workers < 1:
            raise ConfigError(f"max_workers must be >= 1, got {self.max_workers}")
        if self.max_stages is not None and self.max_stages < 1:
            raise ConfigError(f"max_stages must be >= 1, got {self.max_stages}")
        if not self.recompute_options or any(not isinstance(r, bool) for r in self.recompute_options):
            raise ConfigError(f"recompute_options must be a non-empty tuple of bools, got {self.recompute_options}")
        if self.hosts is not None and (self.memory.variant != "engine" or self.memory.in_flight != "cap"):
            raise ConfigError(
                "a per-host budget needs the engine byte model with in_flight='cap' (what executors on several "
                f"hosts hold), got variant={self.memory.variant!r}, in_flight={self.memory.in_flight!r}"
            )


@dataclass(frozen=True)
class PlanOption:
    """One (partition, c^r)'s configuration within a budget, as :meth:`Planner.plan` compares them:
    ``every_item``: all its workers live, no omission, and N·t^d ≥ its worker time (it trains every
    arriving item at every stage)."""

    index: int
    rate: float
    bytes: int
    stages: int
    live_workers: int
    recompute: bool
    every_item: bool
    discount: float = 1.0  # the accuracy objective's R_F-weighted d(τ̄_j) (1 under the rate objective)


def _rounded(rate: float) -> float:
    """R_F rounded to 12 significant digits, so float noise does not break a tie."""
    return float(f"{rate:.12g}")


@dataclass(frozen=True)
class _Candidate:
    cap: float
    geometry: StageGeometry
    memory: MemoryModel
    rate: RateModel
    recompute: bool
    num_workers: int
    reduced: bool = False  # fewer slots than Alg. 2's N (the accuracy objective's extra candidates)


class Planner:
    """Plans for one profile and settings; cheap to call again with another budget."""

    def __init__(self, profile: ModelProfile, settings: PlannerSettings | None = None) -> None:
        self.settings = settings or PlannerSettings()
        self.base_profile = profile  # as given; the planner plans with it read in the machine's time
        scale = self.settings.time_scale
        self.profile = profile.scaled(scale)
        self.arrival_interval = (
            self.settings.arrival_interval if self.settings.arrival_interval is not None else profile.max_forward_time
        )
        if self.arrival_interval <= 0:
            raise ConfigError(
                "arrival interval resolved to 0 (every unit's t_f is 0 in the profile); give one explicitly"
            )
        # c is given in the profile's time; in the machine's time an item's value halves time_scale × later
        given = self.settings.decay
        self.decay = given / scale if given is not None else default_decay(self.profile)
        memory_settings = self.settings.memory
        if memory_settings.admission_queue is not None:  # W = ln 2 / c of this plan's decay
            queue = memory_settings.admission_queue.resolved(self.decay)
            memory_settings = dataclasses.replace(memory_settings, admission_queue=queue)
        self._candidates: list[_Candidate] = []
        per_weight = self.settings.compensation_time / max(1, profile.total_params)
        for cap, partition in candidate_partitions(self.profile):
            if self.settings.max_stages is not None and partition.num_stages > self.settings.max_stages:
                continue
            fresh = StageGeometry.from_profile(self.profile, partition)
            stale = fresh.with_compensation(per_weight)
            rates = {id(g): RateModel(g, self.decay) for g in (fresh, stale)}
            for recompute in self.settings.recompute_options:
                n = num_worker_slots(fresh, self.arrival_interval, recompute)
                if n > 1 or partition.num_stages > 1:  # stale gradients: each one also compensated (reading 14)
                    n = num_worker_slots(stale, self.arrival_interval, recompute)
                if self.settings.max_workers is not None:
                    n = min(n, self.settings.max_workers)
                for slots in self._slot_counts(n):
                    geometry = fresh if slots == 1 and partition.num_stages == 1 else stale
                    memory = MemoryModel(
                        geometry, self.profile, memory_settings, arrival_interval=self.arrival_interval,
                        num_slots=slots,
                    )
                    rate = rates[id(geometry)]
                    self._candidates.append(_Candidate(cap, geometry, memory, rate, recompute, slots, slots < n))
        self._paths: dict[int, SearchPath] = {}
        self._host_bytes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._replays: dict[tuple[tuple[int, ...], tuple[WorkerConfig, ...]], ExpectedStaleness] = {}

    @property
    def weighs_staleness(self) -> bool:
        """Whether plans are ranked by the accuracy objective with a non-zero cost (else by R_F alone)."""
        cost = self.settings.staleness_cost
        return self.settings.objective == "accuracy" and cost is not None and not cost.is_zero

    def _slot_counts(self, n: int) -> tuple[int, ...]:
        """Alg. 2's N first; under a staleness-weighing objective also fewer slots N': every N' ≤
        :data:`EVERY_SLOT_COUNT_UP_TO`, and ⌈N/2⌉, ⌈N/4⌉, … above it (a plan of more workers sharing one
        master applies its gradients at τ ≳ N' − 1, beyond the calibrated staleness; the ladder keeps the
        search O(log N) there)."""
        if not self.weighs_staleness:
            return (n,)
        fewer = set(range(1, min(n - 1, EVERY_SLOT_COUNT_UP_TO) + 1))
        half = n
        while half > EVERY_SLOT_COUNT_UP_TO:
            half = -(-half // 2)
            if half < n:
                fewer.add(half)
        return (n, *sorted(fewer, reverse=True))

    @property
    def stream_bound(self) -> bool:
        """Whether one worker with one stage and no T1 trains every item as it arrives: Σ_i (t̂_i^f + t̂_i^b)
        ≤ t^d (the module docstring). Then R_F's pace 1/(t^f + t^b) is bounded by the stream's."""
        return self.profile.sequential_time <= self.arrival_interval * (1.0 + 1e-12)

    def options(self, budget_bytes: int | None = None, *, discounts: bool = True) -> list[PlanOption]:
        """Each (partition, c^r, slots)'s best configuration within ``budget_bytes`` (None: unconstrained),
        as the plan's choice compares them; :meth:`plan` takes the first of ``sorted(options, key=rank)``.
        ``discounts=False`` leaves the accuracy objective's discount at 1 (:meth:`plan` computes it only
        where it can matter)."""
        out: list[PlanOption] = []
        for index, cand in enumerate(self._candidates):
            path = self._path(index)
            point = self._first_within(index, budget_bytes)
            if point is None:
                continue
            workers = path.workers_at(point)
            live = [w for w in workers if w.live]
            keeps_up = cand.num_workers * self.arrival_interval >= cand.geometry.worker_time(cand.recompute) * (
                1 - 1e-9
            )
            every_item = keeps_up and len(live) == len(workers) and all(not any(w.omission) for w in live)
            discount = self._discount(cand, workers) if discounts and self.weighs_staleness else 1.0
            out.append(
                PlanOption(
                    index, point.rate, point.bytes, cand.geometry.num_stages, len(live), cand.recompute, every_item,
                    discount,
                )
            )
        return out

    def _discounted(self, budget: int | None, options: list[PlanOption]) -> list[PlanOption]:
        """``options`` with their discounts, leaving out those that cannot rank first (exact): a discount is
        at most 1, so an option whose R_F is below the best discounted R_F found so far cannot win; the
        tier of a stream one unsplit worker keeps up with (:meth:`rank`) is ranked by the discount alone,
        so all of it is evaluated."""
        out: list[PlanOption] = []
        best = -math.inf
        first_tier = [o for o in options if self.rank(o)[0] == 0.0] or options
        for option in sorted(first_tier, key=lambda o: -o.rate):
            tied = self.stream_bound and option.every_item
            if not tied and _rounded(option.rate) < best:
                continue
            path = self._path(option.index)
            point = self._first_within(option.index, budget)
            assert point is not None
            discounted = dataclasses.replace(
                option, discount=self._discount(self._candidates[option.index], path.workers_at(point))
            )
            out.append(discounted)
            if not tied:
                best = max(best, _rounded(option.rate * discounted.discount))
        return out

    def expected_staleness(self, geometry: StageGeometry, workers: tuple[WorkerConfig, ...]) -> ExpectedStaleness:
        """The configuration's mean staleness per stage on the virtual clock (cached replay)."""
        key = (geometry.partition.boundaries, workers)
        found = self._replays.get(key)
        if found is None:
            found = replay_staleness(workers, geometry.forward_times, geometry.backward_times, self.arrival_interval)
            self._replays[key] = found
        return found

    def _discount(self, cand: _Candidate, workers: tuple[WorkerConfig, ...]) -> float:
        cost = self.settings.staleness_cost
        assert cost is not None
        return _weighted_discount(cand.rate, workers, self.expected_staleness(cand.geometry, workers), cost)

    def rank(self, option: PlanOption) -> tuple[float, ...]:
        """Sort key of :meth:`options`, best first: when :attr:`stream_bound`, configurations training every
        arriving item first, tied among themselves (under the accuracy objective ordered by their discount);
        then R_F × discount descending (the discount is 1 under the rate objective; equal within 1e-12,
        relative), then R_F; ties: fewer bytes, fewer stages, fewer live workers, c^r = 0, the candidate
        order."""
        tied = self.stream_bound and option.every_item
        rate = 0.0 if tied else -_rounded(option.rate)
        # the accuracy objective: discounted R_F first (among tied configurations, which train every item
        # that arrives, the discount alone); with the zero cost every discount is 1 and the order is R_F's
        score = -_rounded(option.discount if tied else option.rate * option.discount)
        return (
            0.0 if tied or not self.stream_bound else 1.0,
            score,
            rate,
            option.bytes,
            option.stages,
            option.live_workers,
            float(option.recompute),
            option.index,
        )

    @property
    def partitions(self) -> list[Partition]:
        seen: dict[tuple[int, ...], Partition] = {}
        for cand in self._candidates:
            seen.setdefault(cand.geometry.partition.boundaries, cand.geometry.partition)
        return list(seen.values())

    def _path(self, index: int) -> SearchPath:
        path = self._paths.get(index)
        if path is None:
            cand = self._candidates[index]
            path = search_path(cand.rate, cand.memory, cand.num_workers, cand.recompute)
            self._paths[index] = path
        return path

    @property
    def _host_budget(self) -> int | None:
        """The budget every host must fit (:attr:`PlannerSettings.hosts`); None: no per-host bound."""
        return None if self.settings.hosts is None else self.settings.hosts.budget_bytes

    def _first_within(self, index: int, budget: int | None) -> PathPoint | None:
        """The first point of candidate ``index``'s greedy path within ``budget`` (None: any) whose every
        host fits :attr:`PlannerSettings.hosts` (Alg. 2's path, with a per-host test where hosts are set)."""
        path = self._path(index)
        if self._host_budget is None:
            return path.first_within(budget)
        for point in path.points:
            if (budget is None or point.bytes <= budget) and self._fits_hosts(index, point):
                return point
        return None

    def host_bytes_at(self, index: int, point: PathPoint) -> tuple[int, ...]:
        """Bytes per host of candidate ``index`` at ``point`` (cached; :func:`host_bytes`)."""
        hosts = self.settings.hosts
        assert hosts is not None
        key = (index, point.steps_taken)
        found = self._host_bytes.get(key)
        if found is None:
            cand = self._candidates[index]
            found = host_bytes(cand.memory, self._path(index).workers_at(point), hosts.hosts)
            self._host_bytes[key] = found
        return found

    def _fits_hosts(self, index: int, point: PathPoint) -> bool:
        limit = self._host_budget
        return limit is None or max(self.host_bytes_at(index, point)) <= limit

    @property
    def min_feasible_bytes(self) -> int:
        """Smallest budget any partition and c^r can meet (DESIGN §3.7); with a per-host budget, among the
        configurations every host fits (:class:`InfeasibleHostBudgetError` when none does)."""
        limit = self._host_budget
        if limit is None:
            return min(self._path(i).min_bytes for i in range(len(self._candidates)))
        points = [(i, point) for i in range(len(self._candidates)) for point in self._path(i).points]
        fitting = [point.bytes for i, point in points if self._fits_hosts(i, point)]
        if not fitting:
            smallest = min(max(self.host_bytes_at(i, point)) for i, point in points)
            assert self.settings.hosts is not None
            raise InfeasibleHostBudgetError(limit, self.settings.hosts.hosts, smallest)
        return min(fitting)

    def warm(self) -> int:
        """Compute every greedy path now (later plans are lookups; the path cache is not thread-safe, so
        warm a planner before sharing it); returns the minimum feasible bytes."""
        return self.min_feasible_bytes

    def plan(self, budget_bytes: int | None = None) -> Plan:
        """The plan with the highest R_F within ``budget_bytes`` (None: unconstrained, the paper's M+), ties
        and a stream one unsplit worker keeps up with decided by :meth:`rank` (the module docstring)."""
        if budget_bytes is not None and budget_bytes < 0:
            raise ConfigError(f"memory budget must be >= 0 bytes, got {budget_bytes}")
        options = self.options(budget_bytes, discounts=False)
        minimum = self.min_feasible_bytes
        if not options:
            assert budget_bytes is not None
            raise InfeasibleBudgetError(budget_bytes, minimum)
        if self.weighs_staleness:
            options = self._discounted(budget_bytes, options)
        best = min(options, key=self.rank)
        point = self._first_within(best.index, budget_bytes)
        assert point is not None
        plan = self._build_plan(best.index, point, budget_bytes, minimum)
        if self.settings.objective == "accuracy":
            plan = dataclasses.replace(plan, objectives=self.objectives(plan))
        return plan

    def objectives(self, plan: Plan) -> PlanObjectives:
        """Both objectives' view of ``plan`` (a plan of this planner's profile): R_F, the expected staleness
        per stage, and — with a staleness cost in the settings — the discount and the accuracy objective."""
        geometry = StageGeometry.from_profile(self.profile, plan.partition)
        expected = self.expected_staleness(geometry, plan.workers)
        cost = self.settings.staleness_cost
        discount = (
            None
            if cost is None
            else _weighted_discount(RateModel(geometry, self.decay), plan.workers, expected, cost)
        )
        return PlanObjectives(
            objective=self.settings.objective,
            rate=plan.adaptation_rate,
            expected_staleness=expected.mean,
            trained_fraction=expected.trained_fraction,
            discount=discount,
            accuracy=None if discount is None else plan.adaptation_rate * discount,
            cost_source="" if cost is None else cost.source,
        )

    def _build_plan(self, index: int, point: PathPoint, budget: int | None, minimum: int) -> Plan:
        cand = self._candidates[index]
        path = self._path(index)
        workers = path.workers_at(point)
        other = self._recompute_alternative(cand, budget)
        choice = "on" if cand.recompute else "off"
        note = f"T1 (activation recomputation) {choice}: R_F {point.rate:.6g}"
        note += (
            f" vs {other:.6g} with it {'off' if cand.recompute else 'on'}"
            if other is not None
            else (" (the alternative does not fit the budget)")
        )
        return Plan(
            model=self.profile.model,
            partition=cand.geometry.partition,
            workers=workers,
            arrival_interval=self.arrival_interval,
            decay=self.decay,
            stage_forward_time=cand.geometry.t_f,
            stage_backward_time=cand.geometry.t_b,
            adaptation_rate=point.rate,
            planned_bytes=point.bytes,
            paper_memory_elements=point.paper_elements,
            min_feasible_bytes=minimum,
            budget_bytes=budget,
            memory_model=self.settings.memory.variant,
            memory_note=self.settings.memory.describe(),
            dtype=self.settings.memory.dtype,
            memory_breakdown=cand.memory.breakdown(workers),
            steps=path.steps[: point.steps_taken],
            recompute_note=note,
            host_bytes=() if self.settings.hosts is None else self.host_bytes_at(index, point),
        )

    def _recompute_alternative(self, chosen: _Candidate, budget: int | None) -> float | None:
        for index, cand in enumerate(self._candidates):
            if (
                cand.geometry.partition == chosen.geometry.partition
                and cand.recompute != chosen.recompute
                and (cand.num_workers == chosen.num_workers or not (cand.reduced or chosen.reduced))
            ):
                point = self._first_within(index, budget)
                return None if point is None else point.rate
        return None


def _weighted_discount(
    rate: RateModel, workers: tuple[WorkerConfig, ...], expected: ExpectedStaleness, cost: StalenessCost
) -> float:
    """Σ_n Σ_j term_{n,j} · d(τ̄_j) / R_F over the live workers' stage terms of eq. ferret-svre (1 when
    R_F is 0)."""
    worth = [cost.discount(tau) for tau in expected.mean]
    total = weighted = 0.0
    for w in workers:
        if not w.live:
            continue
        for j in range(rate.geometry.num_stages):
            term = rate.stage_term(j, w.recompute, w.accumulation[j], backprop_period(w.omission, j))
            total += term
            weighted += term * worth[j]
    return weighted / total if total > 0 else 1.0
