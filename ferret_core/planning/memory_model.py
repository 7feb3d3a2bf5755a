"""Bytes a configuration needs: what the engine holds (default), or eq. ferret-svre's M_F (DESIGN §3.8, §3.10).

Two variants (``MemorySettings.variant``):

* ``engine`` (the default): a bound on what the engine of DESIGN §3.13 holds at any of its sampled
  points (:mod:`ferret_core.engine.memory_meter`), per live worker n and stage j:

  - **versions**: the replica plus the stashes of items back-propagated at j while they are in flight,
    ``1 + ⌈(K_j − 1)/c^a_{n,j}⌉`` copies of |w_j|, where K_j is the most such items in flight at once
    (an item reads the replica at its F and releases its stash at its B; the replica changes once per
    c^a of its B's, so the oldest in-flight item read a version at most ⌈(K_j − 1)/c^a⌉ updates old).
    With K_j = P − j this is eq. ferret-svre's ``1 + ⌈(P−j−1)/c^a⌉``;
  - **activations**: what the worker's in-flight items hold (graphs, queued stage inputs, output
    gradients; under T1 only stage inputs plus the recomputed graph), from
    :mod:`ferret_core.planning.residency`. T2 does not free activations (items in flight keep their graphs);
  - **accumulation buffer**: |w_j| where c^a_{n,j} > 1 (the engine sums compensated gradients into
    one buffer per worker and stage, T2).

  ``MemorySettings.in_flight`` says where K_j and the activations come from: ``"cap"`` (default) —
  the 1F1B cap of P − j items in flight at stage j, true on any clock and for any action durations
  (the trainer's wall clock); ``"schedule"`` — a replay of the worker's schedule on the profile's stage
  times at the plan's arrival interval, which is what the virtual clock runs (``ferret simulate``,
  ``ferret bench``; it needs ``arrival_interval`` and ``num_slots``). Shared terms: no master copy (the
  master always is the replica of the worker that updated it last; replicas share its storage), the
  transient terms — one gradient between a B and its update (max_j |w_j|; under ``cap`` instead a
  per-worker term ``pending_gradients`` = Σ_j |w_j|: every live worker's stages update concurrently on the
  wall clock), the prediction path's activations (max_l input_l +
  output_l) and, under ``schedule`` with T1, one recomputed graph max_j (internal_j + output_j) (``cap``
  counts one per stage and worker) — and the extras below. Under ``schedule`` the gradient and the
  recomputed graph count as their **max** (:meth:`MemoryModel.transient_elements`: one action runs at a
  time, and at a sample point at most one of them is alive; breakdown entry ``transient_max``), plus the
  prediction path; under ``cap`` all three are summed.
* ``paper``: eq. ferret-svre exactly, per worker Σ_i (1 + ⌈(P−i−1)/c^a⌉ − c^o)(|w_i| + |a_i| −
  c^r·Σ|â_l|), plus the extras and a master copy ΣW and one accumulation buffer per c^a > 1. It is the
  *paper's* planning model, kept to reproduce the paper: it credits T2 with freeing activations the
  engine keeps and is not a bound on measured memory (MobileNet-224 measured 1.97× a plan it "fit").

Extras (both variants, counted once, not per worker): optimizer state (slots × ΣW), compensator state
**only at the stages the plan can make stale** (staleness bound_i > 0, DESIGN §3.13; a stage whose
gradients are never stale allocates nothing, ``make_compensator``): per such stage i, 8 bytes of
statistics for any compensator but ``none`` (plus Iter-Fisher's λ, a float64 scalar tensor, wherever it keeps v_r
and v_a); Iter-Fisher: v_r, v_a = 2|w_i| when λ is tuned plus the
delta ring bound_i·|w_i|; ``iter-fisher-lean``: v_r, v_a only, nothing with η_λ = 0; Gap-Aware and
DC-ASGD-a: |w_i| (:meth:`MemoryModel.stage_compensator_parts`), the transient terms above (``paper``: their sum, with
max_j |w_j| as the gradient), and the OCL algorithm's state (replay buffer items, LwF's teacher ΣW, MAS
importances and anchor 2ΣW).

**Executor processes (ours, not in the paper;** ``MemorySettings.executors="processes"``, engine variant).
:class:`~ferret_core.engine.processes.ProcessClock` allocates each stage's versions up front as K_j slots in
shared memory, for the N live workers: K_j = 1 (master) + N (replicas) + N·(P − j) (stashes) + 1 (a
prediction's pin) + 1 (the slot being written), :func:`process_version_slots`. Counted as a shared
``shared_version_slots`` = 3·ΣW and, per live worker, ``version_slots`` = Σ_j (1 + P − j)·|w_j| in place of
``versions``, plus each stage's slot table (the current slot, then a version and a reader count per slot:
1 + 2·K_j int64s, :func:`slot_table_bytes`): its shared part once (``shared_version_slot_tables``) and
2·(1 + P − j) int64s per live worker (``version_slot_tables``). A re-plan that removes a worker starts a
new clock, whose slots fit its live workers. Each executor keeps its own compensator statistics, so
``compensator_counters`` (the float64 correction accumulator) is a per-worker copy (counted in the shared
compensator term, once per live worker: a removed worker frees it); what the compensator keeps is shared by
the stage's executors, once per stage: Alg. 1's delta ring (``ferret_core.engine.processes.deltas``),
``compensator_ring`` = bound_j·|w_j| plus the ring's three int64 counters; Gap-Aware's average step
(``ferret_core.engine.processes.average``), ``compensator_moments`` = |w_j| plus the int64 update count n;
and the tuning state (``ferret_core.engine.processes.tuning``), ``compensator_moments`` = DC-ASGD-a's mean
square |w_j| plus its int64 count of gradients, or Iter-Fisher's v_r, v_a = 2|w_j| plus λ (float64) and an
int64 flag. Activations, accumulation buffers, pending
gradients and the queue are counted as on threads; each executor measures them in its own process
(:meth:`ProcessClock.measured_bytes`: shared segments + Σ executor peaks;
``tests/integration/test_process_memory.py`` checks it against this total). Not counted: each process's
own runtime (the interpreter and torch, ~100 MB resident per process before its first tensor; the budget
excludes it, docs/processes.md "Memory").

**Plus the admission queue (ours, not in the paper).** With ``MemorySettings.admission_queue`` set (the
trainer's planner), every live worker adds K × (input + label) elements, K = max(⌈(W + D)/(N·t^d)⌉,
⌈B/N⌉) (:mod:`ferret_core.planning.admission_queue`): the inputs admitted items hold while they wait for the
worker's first stage. It is a per-worker term in both variants (in ``paper`` next to eq. ferret-svre's
M_F worker term, like the accumulation buffers), so S4 (worker removal) frees it.
``extras=False`` leaves eq. ferret-svre alone (and the queue, when one is set);
``count_elements=True`` reports elements instead of bytes (the paper's unit, used by golden tests).

API for planners and policies that build on it (all in elements unless named ``bytes``):
:meth:`MemoryModel.stage_versions` (n, j) → versions, :meth:`MemoryModel.residency` (n) → K_j and the
activation peak, :meth:`MemoryModel.worker_elements` / :meth:`MemoryModel.worker_breakdown` (n),
:meth:`MemoryModel.shared_elements` (all workers), :meth:`MemoryModel.total` and
:meth:`MemoryModel.breakdown` in bytes. The planner's search condition, ``planned_bytes`` and
``min_feasible_bytes`` all use :meth:`MemoryModel.total`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferret_core.compensation.ring import COUNTERS as RING_COUNTERS
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan, WorkerConfig
from ferret_core.planning.admission_queue import AdmissionQueue, queue_bytes
from ferret_core.planning.cost_model import StageGeometry, paper_worker_elements
from ferret_core.planning.residency import (
    LABEL_BYTES,
    Residency,
    StageSizes,
    cap_residency,
    cap_stage_activations,
    replay_worker,
)
from ferret_core.profile import ModelProfile, dtype_bytes
from ferret_core.staleness import bound_for_workers

MEMORY_VARIANTS = ("engine", "paper")
IN_FLIGHT_MODES = ("cap", "schedule")
COMPENSATORS_WITH_RING = ("iter-fisher", "iter-fisher-cf")
# copies of a stage's parameters a compensator keeps besides its ring, where the stage can be stale
# (Iter-Fisher's v_r and v_a only while λ is tuned: :meth:`MemoryModel.moment_copies`)
COMPENSATOR_MOMENTS = {"gap-aware": 1, "dc-asgd-a": 1, "iter-fisher-cf": 2}
TUNED_MOMENTS = {"iter-fisher": 2, "iter-fisher-lean": 2}
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}
EXECUTOR_KINDS = ("threads", "processes")
# on executor processes a stage's moments are shared by its executors, with an int64 host count beside: Gap-Aware's
# n (engine/processes/average.py), DC-ASGD-a's gradients folded or Iter-Fisher's "v_a seen" (processes/tuning.py)
SHARED_COUNT_BYTES = 8
CORRECTION_SUM_BYTES = 8  # a compensator's device-side float64 statistics accumulator (compensation/base.py)
LAMBDA_BYTES = 8  # Iter-Fisher's λ, a float64 scalar tensor where it keeps v_r and v_a (compensation/iter_fisher.py)
ITER_FISHER_FAMILY = ("iter-fisher", "iter-fisher-cf", "iter-fisher-lean")
SLOT_TABLE_ENTRY_BYTES = 8  # one int64 of a stage's slot table on executor processes (engine/processes/slots.py)


@dataclass(frozen=True)
class MemorySettings:
    """How predicted memory is counted (see the module docstring)."""

    variant: str = "engine"
    in_flight: str = "cap"  # engine variant: "cap" (any clock) or "schedule" (the virtual clock's replay)
    dtype: str = "float32"
    extras: bool = True
    count_elements: bool = False
    optimizer: str = "sgd"
    compensator: str = "iter-fisher-lean"  # the planner's default (docs/planner.md); "iter-fisher" is Alg. 1
    lambda_tuning: bool = True  # η_λ > 0: Iter-Fisher keeps v_r and v_a (Alg. 1)
    replay_items: int = 0  # ER / MIR buffer size (the paper uses 5000)
    teacher_copy: bool = False  # LwF
    importances: bool = False  # MAS
    micro_batch: int = 1  # items per pipeline step (ER/MIR: the item plus its replayed items)
    # the wall clock's admission queue, K items (input + label) per live worker (ours, not in the paper);
    # None: not counted (the virtual clock admits by its own wait_slots)
    admission_queue: AdmissionQueue | None = None
    # where the executors run (engine variant): "threads" share the Python-owned versions of one process;
    # "processes" allocate K version slots per stage in shared memory up front and share compensator state per
    # stage, statistics per executor (:func:`process_version_slots`; module docstring "Executor processes")
    executors: str = "threads"

    def __post_init__(self) -> None:
        if self.executors not in EXECUTOR_KINDS:
            raise ConfigError(f"executors must be one of {EXECUTOR_KINDS}, got {self.executors!r}")
        if self.executors == "processes" and self.variant != "engine":
            raise ConfigError("executors='processes' counts what the engine allocates: use variant='engine'")
        if self.variant not in MEMORY_VARIANTS:
            raise ConfigError(f"memory model must be one of {MEMORY_VARIANTS}, got {self.variant!r}")
        if self.in_flight not in IN_FLIGHT_MODES:
            raise ConfigError(f"in_flight must be one of {IN_FLIGHT_MODES}, got {self.in_flight!r}")
        if self.optimizer not in OPTIMIZER_SLOTS:
            raise ConfigError(f"optimizer must be one of {sorted(OPTIMIZER_SLOTS)}, got {self.optimizer!r}")
        if self.micro_batch < 1:
            raise ConfigError(f"micro_batch must be >= 1, got {self.micro_batch}")
        if self.replay_items < 0:
            raise ConfigError(f"replay_items must be >= 0, got {self.replay_items}")
        dtype_bytes(self.dtype)

    @classmethod
    def paper_elements(cls) -> MemorySettings:
        """Eq. ferret-svre alone, in elements (the paper's unit)."""
        return cls(variant="paper", extras=False, count_elements=True)

    @property
    def unit_bytes(self) -> int:
        return 1 if self.count_elements else dtype_bytes(self.dtype)

    def describe(self) -> str:
        """One line naming the model, for plan output."""
        if self.variant == "paper":
            return (
                "paper: eq. ferret-svre + extras, the paper's planning model (not a bound on the engine's "
                "memory: it credits T2 with freeing activations the engine keeps)"
            )
        where = (
            "items in flight from the 1F1B cap P−j (any clock)"
            if self.in_flight == "cap"
            else "items in flight from a replay of the virtual clock's schedule (exact there)"
        )
        return f"engine: what the engine holds, {where}"


SHARED_VERSION_SLOTS = 3  # the master, the slot a prediction pins, the slot being written


def worker_version_slots(num_stages: int, stage: int) -> int:
    """Slots one live worker adds at ``stage`` on executor processes: its replica and the stashes of the
    P − j items it may have in flight there."""
    return 1 + (num_stages - stage)


def process_version_slots(live_workers: int, num_stages: int, stage: int) -> int:
    """K_j, the version slots executor processes allocate for ``stage`` in shared memory for
    ``live_workers`` live workers: the master, a replica per worker, the stashes of the P − j items a worker
    may have in flight there, one slot a prediction pins and one being written."""
    return SHARED_VERSION_SLOTS + live_workers * worker_version_slots(num_stages, stage)


def slot_table_bytes(live_workers: int, num_stages: int, stage: int) -> int:
    """Bytes of ``stage``'s slot table on executor processes: the current slot, then a version and a reader
    count per slot, 1 + 2·K_j int64s (:class:`~ferret_core.engine.processes.slots.SharedStageVersions`)."""
    return SLOT_TABLE_ENTRY_BYTES * (1 + 2 * process_version_slots(live_workers, num_stages, stage))


def admission_queue_bytes(profile: ModelProfile, slots: int, live_workers: int, dtype: str = "float32") -> int:
    """Bytes of the wall clock's admission queues as every plan counts them (ours; docs/planner.md, reading
    7b): ``slots`` (K) waiting items per live worker, each its input and its label (:data:`LABEL_BYTES`
    rounded up to whole elements of ``dtype``, as :class:`MemoryModel` and the memory meter count them)."""
    unit = dtype_bytes(dtype)
    label_elements = -(-LABEL_BYTES // unit)
    return queue_bytes(slots, live_workers, profile.input_elements, unit, label_elements * unit)


class MemoryModel:
    """Bytes of a whole configuration: Σ_n worker term + shared term (see the module docstring).

    ``arrival_interval`` (t^d) and ``num_slots`` (N) are needed by the ``schedule`` in-flight mode: a
    worker's items arrive every N·t^d. ``settings.micro_batch`` > 1 (an OCL algorithm's step of the item
    and its replayed items) multiplies every per-item activation size by the step's items.
    """

    def __init__(
        self,
        geometry: StageGeometry,
        profile: ModelProfile,
        settings: MemorySettings,
        *,
        arrival_interval: float | None = None,
        num_slots: int | None = None,
    ) -> None:
        geometry = geometry.per_step(settings.micro_batch)  # activations of a step of micro_batch items
        self.geometry = geometry
        self.settings = settings
        self._engine = settings.variant == "engine"
        self._schedule = self._engine and settings.in_flight == "schedule"
        if self._schedule and (arrival_interval is None or num_slots is None):
            raise ConfigError(
                "memory model 'engine' with in_flight='schedule' replays the virtual clock: give "
                "arrival_interval and num_slots (or use in_flight='cap')"
            )
        self._period = (arrival_interval or 0.0) * (num_slots or 0)
        if self._engine and not geometry.outputs:
            raise ConfigError("the engine memory model needs a StageGeometry built by StageGeometry.from_profile")
        label = -(-LABEL_BYTES // dtype_bytes(settings.dtype))
        batch = settings.micro_batch  # geometry's outputs and internals are per step already
        self.sizes = StageSizes(
            profile.input_elements * batch, geometry.outputs, geometry.graph_internal, label * batch
        )
        self._fixed = self._fixed_extras(profile) if settings.extras else {}
        self._processes = self._engine and settings.executors == "processes"
        # ``cap`` (the wall clock): every live worker's stages run their B and update concurrently, so each
        # worker can hold one gradient per stage, Σ_j |w_j|, waiting for its update at once (measured: a 2 × 2
        # MNISTNet plan held 9.45 MB of gradients, 2 × ΣW; one shared Σ_j |w_j| under-counted it by ΣW).
        self._per_worker_gradients = settings.extras and self._engine and not self._schedule
        self._transients = self._transient_extras(profile) if settings.extras else {}
        self._queue_slot_elements = profile.input_elements + label  # one waiting item: its input and label
        self.queue_slots = 0  # K per live worker (0: the admission queue is not counted)
        if settings.admission_queue is not None:
            if settings.admission_queue.max_wait_s is None or arrival_interval is None or num_slots is None:
                raise ConfigError(
                    "counting the admission queue needs its W resolved (AdmissionQueue.resolved(decay)), the "
                    "arrival interval and the worker slots N"
                )
            self.queue_slots = settings.admission_queue.slots(arrival_interval, num_slots)
        self._ring = settings.extras and settings.compensator in COMPENSATORS_WITH_RING
        self._stateful = settings.extras and settings.compensator != "none"
        self._residency: dict[tuple[bool, tuple[int, ...]], Residency] = {}

    @classmethod
    def for_plan(cls, plan: Plan, profile: ModelProfile, settings: MemorySettings) -> MemoryModel:
        """The model for an existing plan (its partition, arrival interval and worker slots)."""
        geometry = StageGeometry.from_profile(profile, plan.partition)
        if settings.admission_queue is not None:
            settings = dataclasses.replace(settings, admission_queue=settings.admission_queue.resolved(plan.decay))
        return cls(geometry, profile, settings, arrival_interval=plan.arrival_interval, num_slots=plan.num_workers)

    # -- per worker and stage ---------------------------------------------------------------------
    def residency(self, worker: WorkerConfig) -> Residency:
        """K_j and the activation peak of a worker with this T1/T3 configuration (cached)."""
        key = (worker.recompute, worker.omission)
        found = self._residency.get(key)
        if found is None:
            g = self.geometry
            if self._schedule:
                found = replay_worker(
                    self.sizes, g.forward_times, g.backward_times, worker.recompute, worker.omission, self._period
                )
            else:
                found = cap_residency(self.sizes, worker.recompute)
            self._residency[key] = found
        return found

    def stage_versions(self, worker: WorkerConfig, stage: int) -> int:
        """Versions of ``stage`` worker n keeps (engine): its replica plus stashes, 1 + ⌈(K_j − 1)/c^a⌉."""
        most = self.residency(worker).backprop_in_flight[stage]
        return 1 + math.ceil(max(0, most - 1) / worker.accumulation[stage])

    def worker_breakdown(self, worker: WorkerConfig) -> dict[str, int]:
        """Worker n's term by component, in elements (empty when removed)."""
        if not worker.live:
            return {}
        g = self.geometry
        buffers = sum(w for w, a in zip(g.weights, worker.accumulation, strict=True) if a > 1)
        queue = self.queue_elements(worker)
        if not self._engine:
            paper = paper_worker_elements(
                g, worker.recompute, worker.accumulation, worker.omission
            )  # M_F, eq. ferret-svre
            parts = {"workers": paper, "accumulation_buffers": buffers if self.settings.extras else 0}
        elif self._processes:  # the worker's version slots and its executors' own state
            slots = sum(worker_version_slots(g.num_stages, j) * g.weights[j] for j in range(g.num_stages))
            # each of its slots' version and reader count in the stage's table (ours, slot_table_bytes)
            entries = 2 * sum(worker_version_slots(g.num_stages, j) for j in range(g.num_stages))
            parts = {
                "version_slots": slots,
                "version_slot_tables": self._elements_of(entries * SLOT_TABLE_ENTRY_BYTES),
                "activations": self.residency(worker).peak,
                "accumulation_buffers": buffers,
            }  # the executors' compensator state: :meth:`compensator_breakdown`, one per live worker
            if self._per_worker_gradients:
                parts["pending_gradients"] = g.total_weights
        else:
            versions = sum(self.stage_versions(worker, j) * g.weights[j] for j in range(g.num_stages))
            parts = {"versions": versions, "activations": self.residency(worker).peak, "accumulation_buffers": buffers}
            if self._per_worker_gradients:
                parts["pending_gradients"] = g.total_weights  # one per stage between its B and its update
        if queue:
            parts["admission_queue"] = queue  # plus the queue (ours, not in the paper)
        return parts

    def queue_elements(self, worker: WorkerConfig) -> int:
        """Worker n's admission queue (ours, not in the paper): K waiting items' inputs and labels, K =
        max(⌈(W + D)/(N·t^d)⌉, ⌈B/N⌉) (:mod:`ferret_core.planning.admission_queue`); 0 when removed or not counted."""
        if not worker.live:
            return 0
        return self.queue_slots * self._queue_slot_elements

    def worker_elements(self, worker: WorkerConfig) -> int:
        """Worker n's term, in elements (0 when removed)."""
        return sum(self.worker_breakdown(worker).values())

    # -- shared -----------------------------------------------------------------------------------
    def _fixed_extras(self, profile: ModelProfile) -> dict[str, int]:
        s = self.settings
        g = self.geometry
        total_w = g.total_weights
        extras: dict[str, int] = {}
        if not self._engine:
            extras["master_copy"] = total_w
        if self._engine and s.executors == "processes":  # K_j's shared slots: master, prediction, write
            extras["shared_version_slots"] = SHARED_VERSION_SLOTS * total_w
            # their slot-table entries and each stage's current slot, P·(1 + 2·3) int64s (ours, slot_table_bytes)
            table = g.num_stages * (1 + 2 * SHARED_VERSION_SLOTS) * SLOT_TABLE_ENTRY_BYTES
            extras["shared_version_slot_tables"] = self._elements_of(table)
        extras["optimizer_state"] = OPTIMIZER_SLOTS[s.optimizer] * total_w
        if s.replay_items:
            extras["replay_buffer"] = s.replay_items * profile.input_elements
        if s.teacher_copy:
            extras["lwf_teacher"] = total_w
        if s.importances:
            extras["mas_importances"] = 2 * total_w
        return extras

    def _transient_extras(self, profile: ModelProfile) -> dict[str, int]:
        """The gradient between a B and its update (``schedule`` and ``paper``: max_j |w_j|, one action at a
        time; ``cap``: per live worker instead, see :meth:`worker_breakdown`) and the prediction path,
        max_l (input_l + output_l)."""
        g = self.geometry
        outputs = [layer.activations for layer in profile.layers]
        inputs = [profile.input_elements, *outputs[:-1]]
        path = {"prediction_path": max(i + o for i, o in zip(inputs, outputs, strict=True))}
        if self._per_worker_gradients:  # ``cap``: counted per live worker (:meth:`worker_breakdown`)
            return path
        return {"transient_gradient": max(g.weights), **path}

    def transient_parts(self, recompute: bool) -> dict[str, int]:
        """The terms held only around one action or one prediction: the transient gradient, the
        prediction path and (``schedule`` with T1) the recomputed graph, in elements."""
        parts = dict(self._transients)
        regraph = self.recompute_graph_elements(recompute)
        if regraph:
            parts["recompute_graph"] = regraph
        return parts

    def transient_elements(self, recompute: bool) -> int:
        """The transient terms as the engine can hold them at once. ``schedule`` (the virtual clock):
        the **max** of the gradient and the recomputed graph — one action runs at a time and memory is
        sampled after it, so at a sample point at most one of them is alive: after an R its graph (no
        gradient is pending: with c^a = 1 a B's update runs inside the B's action, with c^a > 1 the sum
        is an accumulation buffer, counted per worker), after a B its gradient (that B freed the R's
        graph) — plus the prediction path. A prediction runs between actions and is never sampled, but
        taken into the max it left one zoo plan (MNISTNet, 2 stages, T3+T4) measured 3,160 bytes (one
        input and its label) above the prediction: an under-count of the activations' replay that this
        term covered, not diagnosed yet, so it stays summed. ``cap`` (the wall clock: stages
        and the prediction thread run concurrently) and ``paper``: all summed."""
        parts = self.transient_parts(recompute)
        if not self._schedule:
            return sum(parts.values())
        path = parts.pop("prediction_path", 0)
        return path + max(parts.values(), default=0)

    @property
    def has_ring(self) -> bool:
        return self._ring

    @property
    def has_compensator_state(self) -> bool:
        """Whether the compensator's bytes depend on the configuration (any compensator but ``none``)."""
        return self._stateful

    def keeps_lambda_tensor(self) -> bool:
        """Whether the compensator keeps λ as a tensor at a stage that can be stale: Iter-Fisher's family
        wherever it keeps v_r and v_a (λ tuned; always for ``iter-fisher-cf``)."""
        return self.settings.compensator in ITER_FISHER_FAMILY and self.moment_copies() > 0

    def _elements_of(self, nbytes: int) -> int:
        """``nbytes`` in elements of the model's dtype, rounded up."""
        return -(-nbytes // dtype_bytes(self.settings.dtype))

    def moment_copies(self) -> int:
        """Copies of a stage's parameters the compensator keeps besides its ring, at a stage that can be
        stale: v_r, v_a of Alg. 1 (while λ is tuned), Gap-Aware's C, DC-ASGD-a's MeanSquare."""
        s = self.settings
        if s.compensator in TUNED_MOMENTS:
            return TUNED_MOMENTS[s.compensator] if s.lambda_tuning else 0
        return COMPENSATOR_MOMENTS.get(s.compensator, 0)

    def stage_compensator_parts(self, stage: int, bound: int, live_workers: int = 1) -> dict[str, int]:
        """Elements the compensator of ``stage`` holds when the stage's staleness bound is ``bound``: nothing
        at ``bound`` = 0 (no gradient there is ever stale: the compensators allocate nothing, ``make_compensator``),
        else its moments, its float64 correction accumulator and (Alg. 1) a ring of ``bound`` deltas. On
        executor processes every live worker's executor keeps its own accumulator, and the stage's executors
        share its moments once, with an int64 count (Gap-Aware's C and n; the tuning state: DC-ASGD-a's mean
        square, Iter-Fisher's v_r, v_a and λ)."""
        if not self._stateful or bound <= 0:
            return {}
        w = self.geometry.weights[stage]
        copies = self.live_copies(live_workers)
        # the float64 correction accumulator, and Iter-Fisher's float64 λ wherever it keeps v_r, v_a (ours)
        lam = LAMBDA_BYTES if self.keeps_lambda_tensor() else 0
        if self._processes:  # λ is in the stage's shared tuning state (engine/processes/tuning.py), once
            parts = {"compensator_counters": copies * self._elements_of(CORRECTION_SUM_BYTES)}
            if self.moment_copies():
                shared = self._elements_of(lam + SHARED_COUNT_BYTES)
                parts["compensator_moments"] = self.moment_copies() * w + shared
        else:
            parts = {"compensator_counters": self._elements_of(CORRECTION_SUM_BYTES + lam)}
            if self.moment_copies():
                parts["compensator_moments"] = self.moment_copies() * w
        if self._ring:  # one ring per stage (on executor processes: the shared ring, with its counters)
            parts["compensator_ring"] = bound * w + (self._ring_counter_elements() if self._processes else 0)
        return parts

    def _ring_counter_elements(self) -> int:
        """The shared ring's int64 counters (pushed, head, held) in elements of the model's dtype."""
        return self._elements_of(RING_COUNTERS * 8)

    def live_copies(self, live_workers: int) -> int:
        """Copies of the per-stage compensator state: one per live worker on executor processes, else one."""
        return max(1, live_workers) if self._processes else 1

    def stage_compensator_elements(self, stage: int, bound: int, live_workers: int = 1) -> int:
        return sum(self.stage_compensator_parts(stage, bound, live_workers).values())

    def compensator_breakdown(self, workers: Sequence[WorkerConfig]) -> dict[str, int]:
        """The compensators' elements by component, over the stages the workers can make stale (DESIGN
        §3.13's bound per stage, :func:`ferret_core.staleness.bound_for_workers`)."""
        if not self._stateful:
            return {}
        p = self.geometry.num_stages
        live = sum(1 for w in workers if w.live)
        parts: dict[str, int] = {}
        for i in range(p):
            for name, value in self.stage_compensator_parts(i, bound_for_workers(workers, i, p), live).items():
                parts[name] = parts.get(name, 0) + value
        return parts

    @property
    def fixed_elements(self) -> int:
        """Extras that do not depend on the configuration."""
        return sum(self._fixed.values())

    def ring_elements(self, workers: Sequence[WorkerConfig]) -> int:
        """Iter-Fisher delta ring: Σ_i bound_i·|w_i| (DESIGN §3.4, sized by the staleness bound)."""
        return self.compensator_breakdown(workers).get("compensator_ring", 0)

    def compensator_elements(self, workers: Sequence[WorkerConfig]) -> int:
        """Every compensator's state: moments, accumulators and ring, at the stages that can be stale."""
        return sum(self.compensator_breakdown(workers).values())

    def recompute_graph_elements(self, recompute: bool) -> int:
        """``schedule`` mode with T1: the largest graph a recompute builds, max_j (internal_j + output_j),
        counted once for all workers (one action runs at a time on the virtual clock); 0 otherwise (the
        ``cap`` bound counts one per stage inside each worker's term)."""
        if not (self._schedule and recompute):
            return 0
        return max(i + o for i, o in zip(self.sizes.internal, self.sizes.outputs, strict=True))

    def shared_elements(self, workers: Sequence[WorkerConfig]) -> int:
        recompute = any(w.live and w.recompute for w in workers)
        return self.fixed_elements + self.compensator_elements(workers) + self.transient_elements(recompute)

    # -- by stage ---------------------------------------------------------------------------------
    def stage_breakdown(self, workers: Sequence[WorkerConfig]) -> tuple[tuple[dict[str, int], ...], dict[str, int]]:
        """:meth:`breakdown` by where it lives: per stage j, the bytes its owner holds (every worker's
        versions or version slots of j, their activations at j, accumulation buffers and pending gradients
        of j, j's shared slots, optimizer state and compensator state; the transient gradient at the largest
        stage), and the bytes of the record path, which holds no stage (admission queues, the prediction
        path, the replay buffer). The stages' and the record path's values sum to :meth:`total`. Defined for
        the engine's ``cap`` bound, the one executors on several hosts plan with: a ``schedule`` replay's
        peak and the paper's M_F are not sums over stages."""
        if not self._engine or self._schedule:
            raise ConfigError(
                "bytes by stage need the engine memory model with in_flight='cap' (the wall clock's bound); got "
                f"variant={self.settings.variant!r}, in_flight={self.settings.in_flight!r}"
            )
        g = self.geometry
        p = g.num_stages
        stages: list[dict[str, int]] = [{} for _ in range(p)]
        record: dict[str, int] = {}

        def add(where: dict[str, int], name: str, elements: int) -> None:
            if elements:
                where[name] = where.get(name, 0) + elements

        for worker in workers:
            if not worker.live:
                continue
            activations = cap_stage_activations(self.sizes, worker.recompute)
            for j in range(p):
                if self._processes:
                    slots = worker_version_slots(p, j)
                    add(stages[j], "version_slots", slots * g.weights[j])
                    add(stages[j], "version_slot_tables", self._elements_of(2 * slots * SLOT_TABLE_ENTRY_BYTES))
                else:
                    add(stages[j], "versions", self.stage_versions(worker, j) * g.weights[j])
                add(stages[j], "activations", activations[j])
                add(stages[j], "accumulation_buffers", g.weights[j] if worker.accumulation[j] > 1 else 0)
                if self._per_worker_gradients:
                    add(stages[j], "pending_gradients", g.weights[j])
            add(record, "admission_queue", self.queue_elements(worker))
        for name, value in self._fixed.items():
            if name == "shared_version_slots":
                for j in range(p):
                    add(stages[j], name, SHARED_VERSION_SLOTS * g.weights[j])
            elif name == "shared_version_slot_tables":
                for j in range(p):
                    add(stages[j], name, self._elements_of((1 + 2 * SHARED_VERSION_SLOTS) * SLOT_TABLE_ENTRY_BYTES))
            elif name == "replay_buffer":
                add(record, name, value)
            else:  # optimizer state, LwF's teacher, MAS's importances: copies of the weights, per stage
                copies = value // g.total_weights if g.total_weights else 0
                for j in range(p):
                    add(stages[j], name, copies * g.weights[j])
        recompute = any(w.live and w.recompute for w in workers)
        for name, value in self.transient_parts(recompute).items():
            if name == "prediction_path":
                add(record, name, value)
            else:  # the transient gradient, max_j |w_j|: at its largest stage
                add(stages[max(range(p), key=lambda j: g.weights[j])], name, value)
        live = sum(1 for w in workers if w.live)
        for j in range(p):
            for name, value in self.stage_compensator_parts(j, bound_for_workers(workers, j, p), live).items():
                add(stages[j], name, value)
        unit = self.settings.unit_bytes
        return (
            tuple({k: v * unit for k, v in part.items()} for part in stages),
            {k: v * unit for k, v in record.items()},
        )

    # -- totals -----------------------------------------------------------------------------------
    def total(self, workers: Sequence[WorkerConfig]) -> int:
        """Predicted memory of the configuration in bytes (elements with ``count_elements``)."""
        elements = sum(self.worker_elements(w) for w in workers) + self.shared_elements(workers)
        return elements * self.settings.unit_bytes

    def breakdown(self, workers: Sequence[WorkerConfig]) -> dict[str, int]:
        """Bytes by component; the values sum to :meth:`total`."""
        unit = self.settings.unit_bytes
        parts: dict[str, int] = {}
        for worker in workers:
            for name, value in self.worker_breakdown(worker).items():
                parts[name] = parts.get(name, 0) + value * unit
        parts.update({name: value * unit for name, value in self._fixed.items()})
        recompute = any(w.live and w.recompute for w in workers)
        if self._schedule:  # the larger of gradient and recomputed graph (never both at a sample), the path
            transients = self.transient_parts(recompute)
            if transients:
                path = transients.pop("prediction_path", 0)
                parts["prediction_path"] = path * unit
                parts["transient_max"] = max(transients.values(), default=0) * unit
        else:
            parts.update({name: value * unit for name, value in self.transient_parts(recompute).items()})
        parts.update({name: value * unit for name, value in self.compensator_breakdown(workers).items()})
        return parts
