"""What each of the engine's methods means live, on the wall clock (``trainer.method``, ``ferret run
--method``). The names and the policies come from the core's registry (``ferret_core.engine.METHOD_NAMES``,
``make_policy``): a method the engine gains is live here without a change.

The live reading of a policy's :class:`~ferret_core.engine.policies.PolicySetup`:

* **Methods that run on the planner's plan** (the registry's ``needs_plan``: ``ferret``, and the pipeline
  schedules, which execute its partition and worker slots) run the plan the planner made for the budget,
  and re-plan on ``SetMemoryBudget`` and on a drifting measured arrival interval.
* **Methods with a fixed plan** (not ``needs_plan``; today ``oracle``, ``1-skip`` and the buffering
  baselines ``random-n``, ``last-n``, ``camel``: one worker, one stage, no T1–T4) run that plan whatever
  the budget: a configured ``trainer.budget_bytes`` is a
  config error at start-up, and ``SetMemoryBudget`` answers FAILED_PRECONDITION (:class:`BudgetNotPlanned`,
  the plan in force unchanged); a ``measured`` arrival interval re-plans nothing.
* **Instant methods** (``instant``: every action takes no time on the virtual clock; today ``oracle``)
  cannot be instant on the wall clock. Their reading is "train every item, in arrival order, without
  skipping": admission is unbounded (:class:`QueueEveryItem`), so while training is slower than the
  stream the queue of admitted items (their inputs) grows without bound, and so do a drain's duration
  and prediction-to-training delay. Use it to measure what training every item costs, not to serve.
* ``1-skip`` keeps its rule on the wall clock: an item is trained only if the trainer is free when it
  arrives, else it is skipped as ``busy``.
* ``random-n``, ``last-n``, ``camel`` run with the registry's default N, B and Camel buffer
  (:class:`~ferret_core.engine.buffering.BufferingSettings`; their setup carries the feeder the wall
  clock pulls mini-batches from when the trainer is free). Fitting N to a budget is ``ferret simulate``'s
  (``MethodOptions.budget``); live, a budget is refused as for the other fixed plans. Every labelled
  arrival enters their window (the admission rule below does not apply: the window's B bounds what
  waits, evicting the oldest).

**Admission by event time** (:mod:`ferret_core.engine.admission`, ``docs/service.md`` "Admission"): every
method that is not instant judges an arrival by its event time, not by when Kafka delivered it: its
worker takes it iff it would have started it within W of its event time (W = ln 2 / c, the time the
item's data value halves under the plan's decay c, read in the machine's time: × the worker's measured
service time ÷ its service time by the profile; 1-Skip: W = 0, "free when it arrives"), and admitted
items wait in a bounded queue per worker of K = max(⌈(W + D) / (N·t^d)⌉, ⌈B / N⌉) inputs
(D = :data:`DELIVERY_SPREAD_S`, what one Kafka delivery may bring late; B = :data:`DELIVERY_ITEMS`, the most
records one delivery hands over). :func:`live_admission` gives W and K for a method and plan.

**The queue is in every planned figure** (docs/planner.md reading 7b): the trainer's planner counts K ×
(input + label) per live worker in Ferret's plan; :func:`count_admission_queue` adds the same term, from
the K the wall clock enforces, to the planned bytes of every other method that admits through the queue
(the pipeline schedules, 1-Skip), so their status ``planned_bytes`` (and a schedule's GetPlan) count what
runs. Not counted where nothing waits in it: the buffering methods (their window, counted in their own
bytes, holds what waits) and the instant methods (Oracle: the queue is unbounded by design, so no
planned figure bounds it; its planned bytes leave the queue out).
"""

from __future__ import annotations

import dataclasses
import sys

from ferret_core.engine import METHOD_NAMES, METHODS, MethodOptions, make_policy
from ferret_core.engine.admission import AdmissionSettings, max_wait, queue_slots
from ferret_core.engine.policies import PolicySetup
from ferret_core.plan import Plan
from ferret_core.planning.memory_model import MemorySettings, admission_queue_bytes
from ferret_core.profile import ModelProfile
from ferret_core.schedule.scheduler import ScheduleRules
from services.control.errors import BudgetNotPlanned

# D: the longest an item's delivery may lag its event time without the trainer being behind: the
# consumer's fetch wait (10 ms) and one batch of the loop, plus the local broker's hop (p99 ≈ 20–60 ms,
# benchmarks/service/results/latency.md). Items delivered together within D are not a burst.
DELIVERY_SPREAD_S = 0.1
# B: the most records one delivery hands the trainer (the record loop's consume() batch). The admission
# queue holds at least one worker's share of it, so a backlog after a pause (start-up, a re-plan's drain,
# a snapshot) is trained when the worker keeps up instead of overflowing a queue sized for the steady rate.
DELIVERY_ITEMS = 256
# H: an admitted item starts within W + H of its admission (by the measured service time), so the real
# queue holds at most ⌊(W + H) / s⌋ items: the event-time rule's timeline has no feedback from the real
# queue, and without this bound it grows up to K behind the predictions (measured in
# benchmarks/live/README.md). H = 1 s: a backlog of up to about a second of work (the stream's late
# start-up records, ~0.7 s; a snapshot; the 0.4–0.9 s stalls seen live) is trained, not skipped. With
# H = D = 0.1 s the demo (MNIST, 50/s, one worker at ~4 ms per item) skipped 89 of 3000 items `busy`
# and scored 55.10 % against the plain loop's 56.50 %; with H = 1 s it trained 3000 of 3000, 56.40 %.
START_HORIZON_S = 1.0


class QueueEveryItem:
    """A policy's rules with unbounded admission: every arriving item waits for its worker (FIFO)."""

    def __init__(self, rules: ScheduleRules) -> None:
        self.rules = rules

    @property
    def num_workers(self) -> int:
        return self.rules.num_workers

    @property
    def num_stages(self) -> int:
        return self.rules.num_stages

    @property
    def wait_slots(self) -> int:
        return sys.maxsize

    def lowest_backprop_stage(self, worker: int, item_in_worker: int) -> int | None:
        return self.rules.lowest_backprop_stage(worker, item_in_worker)

    def in_flight_cap(self, worker: int, stage: int) -> int:
        return self.rules.in_flight_cap(worker, stage)


def live_admission(
    setup: PolicySetup, planned: Plan, delivery_s: float = DELIVERY_SPREAD_S, delivery_items: int = DELIVERY_ITEMS
) -> AdmissionSettings | None:
    """W and K for a policy's setup (module docstring); ``None`` for instant methods, which queue every
    item. A method that lets no item wait (``wait_slots == 0``, 1-Skip) has W = 0; the others W = ln 2 / c
    of the planner's plan ``planned``. Until the wall clock has measured a worker, it assumes one item
    takes the whole model's time by the profile (``planned``'s stages × (t^f + t^b))."""
    if setup.instant:
        return None
    plan = setup.plan
    wait = 0.0 if setup.rules.wait_slots == 0 else max_wait(planned.decay)
    slots = queue_slots(wait, delivery_s, planned.arrival_interval, plan.num_workers, delivery_items)
    whole_model = planned.num_stages * (planned.stage_forward_time + planned.stage_backward_time)
    return AdmissionSettings(
        wait,
        slots,
        initial_service_s=whole_model / plan.num_stages,
        profile_service_s=plan.stage_forward_time + plan.stage_backward_time,  # W in the machine's time
        start_horizon_s=START_HORIZON_S,
    )


def live_setup(
    method: str,
    plan: Plan,
    model: str,
    num_units: int,
    *,
    profile: ModelProfile | None = None,
    compensator: str = "none",
    delivery_s: float = DELIVERY_SPREAD_S,
    executors: str = "threads",
) -> tuple[PolicySetup, AdmissionSettings | None]:
    """The setup the wall clock runs for ``method`` given the planner's ``plan`` (module docstring), and
    how it admits arrivals by event time; with the model's ``profile`` the schedules and the sequential
    methods report their planned bytes (counting the state of ``compensator``, on ``executors``: threads or
    processes, :class:`~ferret_core.planning.memory_model.MemorySettings`)."""
    memory = MemorySettings(variant="engine", compensator=compensator, executors=executors)
    options = MethodOptions(memory=memory)
    setup = make_policy(method, plan, profile=profile, options=options).setup(model, num_units, plan.arrival_interval)
    admission = live_admission(setup, plan, delivery_s)
    setup = count_admission_queue(setup, admission, profile)
    if setup.instant:
        setup = dataclasses.replace(setup, rules=QueueEveryItem(setup.rules))
    return setup, admission


def count_admission_queue(
    setup: PolicySetup, admission: AdmissionSettings | None, profile: ModelProfile | None
) -> PolicySetup:
    """``setup`` with the wall clock's admission queue in its planned bytes: K (``admission.queue_slots``,
    what the wall clock enforces) × (input + label) per live worker of the executed plan, as the planner
    counts it for Ferret (:func:`~ferret_core.planning.memory_model.admission_queue_bytes`), under
    ``memory_breakdown["admission_queue"]``. Unchanged where the plan counts it already (the trainer's
    planner made it), where no bytes are planned (no profile), where admission is unbounded (instant
    methods) and where arrivals wait in a method's window instead (buffering methods)."""
    planned = setup.planned
    if planned is None or profile is None or admission is None or setup.feeder is not None:
        return setup
    if "admission_queue" in planned.memory_breakdown:
        return setup
    live = sum(1 for worker in setup.plan.workers if worker.live)
    queue = admission_queue_bytes(profile, admission.queue_slots, live, planned.dtype)
    counted = dataclasses.replace(
        planned,
        planned_bytes=planned.planned_bytes + queue,
        memory_breakdown={**planned.memory_breakdown, "admission_queue": queue},
    )
    executed = counted if setup.plan == planned else setup.plan  # a schedule executes its planned plan
    return dataclasses.replace(setup, plan=executed, planned=counted)


def plans_for_budget(method: str) -> bool:
    """Whether ``method`` runs on the planner's plan (Ferret, and the pipeline schedules on its partition
    and worker slots), so a memory budget means something to it (the registry's ``needs_plan``)."""
    return METHODS[method].needs_plan


def budget_methods() -> tuple[str, ...]:
    """The registry's methods that plan for a budget."""
    return tuple(m for m in METHOD_NAMES if plans_for_budget(m))


def not_planned(method: str) -> BudgetNotPlanned:
    return BudgetNotPlanned(
        f"method {method!r} does not plan for a memory budget (its plan is fixed); the plan in force is "
        f"unchanged. Budgets apply to {', '.join(budget_methods())}: run the trainer with one of them"
    )


class FixedPlan:
    """The control plane's planner for a method with a fixed plan: every budget is refused."""

    def __init__(self, method: str) -> None:
        self.method = method

    def plan(self, budget_bytes: int | None = None) -> Plan:
        raise not_planned(self.method)
