"""The paper's budgets per setting, as the paper defines them (DESIGN §3.2).

- ``M+``: no budget (the planner's unconstrained plan).
- ``M``: the measured peak bytes of PipeDream-2BW run on the same partition (its plan at ``M+``), **under
  the same OCL algorithm** as the arm it budgets: an algorithm's state (ER/MIR's replay buffer, LwF's
  teacher, MAS's importances and anchor) is part of what PipeDream-2BW holds, so M is measured per
  (setting, algorithm) and Ferret at M plans with the same state inside the same bytes.
- ``M-``: the smallest budget at which the planner still keeps M's partition (bisection over budgets
  between the planner's minimum feasible bytes and M; the minimum itself is reported as ``absolute_min``),
  planned for the same algorithm and **per compensator** (the arm's, Iter-Fisher where it names none):
  compensator state counts in the planner's bytes at the stages a plan can make stale.
- ``sweep2`` / ``sweep4``: halfway between M- and M, and between M and the planner's predicted bytes at
  M+: with M-, M and M+ the five budgets of the pipelines sweep.

Plans come from ``ferret plan --algorithm A --in-flight schedule --json`` (in process: the plan ``ferret
simulate`` makes on its virtual clock, whose default is ``--in-flight schedule``) and the measurement from
one ``ferret simulate`` run (seed 0), so the budgets follow whatever byte model and planner the checkout
has.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ferret_core.errors import ConfigError
from services.bench.specs import Setting

PlanFn = Callable[[Setting, int | None], dict[str, Any] | None]  # None: infeasible
MeasureFn = Callable[[Setting], int]
RELATIVE_TOLERANCE = 1e-3  # bisection stops when the bracket is this narrow relative to M


@dataclass(frozen=True)
class Budgets:
    """The budgets of one setting, in bytes."""

    setting: str
    m: int
    m_minus: int
    absolute_min: int
    planner_m_plus: int  # the planner's predicted bytes without a budget
    algorithm: str = "vanilla"  # the OCL algorithm M was measured (and M- planned) under
    compensator: str = "iter-fisher"  # the compensator M- was planned with (its state counts in the bytes)

    def bytes_for(self, label: str) -> int | None:
        """The ``--budget`` of a budget label; ``None`` for ``M+`` and ``none`` (no budget)."""
        values = {
            "M": self.m,
            "M-": self.m_minus,
            "sweep2": (self.m_minus + self.m) // 2,
            "sweep4": (self.m + max(self.m, self.planner_m_plus)) // 2,
        }
        if label in ("M+", "none"):
            return None
        if label not in values:
            raise ConfigError(f"unknown budget label {label!r}: expected M+, M, M-, sweep2 or sweep4")
        return values[label]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Budgets:
        return cls(
            setting=str(data["setting"]),
            m=int(data["m"]),
            m_minus=int(data["m_minus"]),
            absolute_min=int(data["absolute_min"]),
            planner_m_plus=int(data["planner_m_plus"]),
            algorithm=str(data.get("algorithm", "vanilla")),
            compensator=str(data.get("compensator", "iter-fisher")),
        )


def resolve_budgets(
    setting: Setting, plan: PlanFn, measure: MeasureFn, algorithm: str = "vanilla", compensator: str = "iter-fisher"
) -> Budgets:
    """M from ``measure`` (PipeDream-2BW's measured bytes), M- by bisection over ``plan``; both for
    ``algorithm`` (``measure`` and ``plan`` run under it), ``plan`` with ``compensator`` (recorded)."""
    unconstrained = plan(setting, None)
    if unconstrained is None:
        raise ConfigError(f"{setting.id}: the planner found no plan without a budget")
    m = int(measure(setting))
    at_m = plan(setting, m)
    if at_m is None:
        raise ConfigError(
            f"{setting.id}: M = {m} B (PipeDream-2BW's measured bytes) is below the planner's minimum "
            f"{unconstrained['min_feasible_bytes']} B; the byte models disagree: report it"
        )
    partition = at_m["partition"]
    low, high = int(unconstrained["min_feasible_bytes"]), m  # plan(high) keeps the partition
    tolerance = max(1, int(m * RELATIVE_TOLERANCE))
    while high - low > tolerance:
        middle = (low + high) // 2
        candidate = plan(setting, middle)
        if candidate is not None and candidate["partition"] == partition:
            high = middle
        else:
            low = middle
    return Budgets(
        setting=setting.id,
        m=m,
        m_minus=high,
        absolute_min=int(unconstrained["min_feasible_bytes"]),
        planner_m_plus=int(unconstrained["planned_bytes"]),
        algorithm=algorithm,
        compensator=compensator,
    )


CliFn = Callable[[list[str]], int]  # services.cli.main.main: argv -> exit status
EXIT_INFEASIBLE = 3  # ferret's exit status for an infeasible budget (DESIGN §4)


def plan_with_cli(main: CliFn, compensator: str = "iter-fisher", algorithm: str = "vanilla") -> PlanFn:
    """A :data:`PlanFn` that runs ``ferret plan --json`` in this process through ``main`` (the CLI's entry
    point, passed in: nothing below the CLI imports it), for ``algorithm`` and with items in flight from
    the virtual clock's schedule (``--in-flight schedule``): the plan ``ferret simulate`` makes with the
    same options (``ferret plan``'s own default, ``cap``, is the wall clock's bound); exit 3: infeasible."""

    def plan(setting: Setting, budget: int | None) -> dict[str, Any] | None:
        argv = ["plan", "--profile", setting.profile, "--compensator", compensator, "--algorithm", algorithm]
        argv += ["--in-flight", "schedule", "--json"]
        if budget is not None:
            argv += ["--budget", str(budget)]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
        if status == EXIT_INFEASIBLE:
            return None
        if status != 0:
            raise ConfigError(f"ferret {' '.join(argv)} failed (exit {status}): {err.getvalue().strip()}")
        result: dict[str, Any] = json.loads(out.getvalue())
        return result

    return plan
