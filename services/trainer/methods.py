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
  arrives (no waiting slot), else it is skipped as ``busy``.
* ``random-n``, ``last-n``, ``camel`` run with the registry's default N, B and Camel buffer
  (:class:`~ferret_core.engine.buffering.BufferingSettings`; their setup carries the feeder the wall
  clock pulls mini-batches from when the trainer is free). Fitting N to a budget is ``ferret simulate``'s
  (``MethodOptions.budget``); live, a budget is refused as for the other fixed plans.
"""

from __future__ import annotations

import dataclasses
import sys

from ferret_core.engine import METHOD_NAMES, METHODS, MethodOptions, make_policy
from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.scheduler import ScheduleRules
from ferret_core.memory_model import MemorySettings
from ferret_core.plan import Plan
from ferret_core.profile import ModelProfile
from services.control.errors import BudgetNotPlanned


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


def live_setup(
    method: str,
    plan: Plan,
    model: str,
    num_units: int,
    *,
    profile: ModelProfile | None = None,
    compensator: str = "none",
) -> PolicySetup:
    """The setup the wall clock runs for ``method`` given the planner's ``plan`` (module docstring); with
    the model's ``profile`` the schedules and the sequential methods report their planned bytes (counting
    the state of ``compensator``)."""
    options = MethodOptions(memory=MemorySettings(variant="engine", compensator=compensator))
    setup = make_policy(method, plan, profile=profile, options=options).setup(model, num_units, plan.arrival_interval)
    if setup.instant:
        setup = dataclasses.replace(setup, rules=QueueEveryItem(setup.rules))
    return setup


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
