"""The cost of staleness calibrated on the live stream's head (``trainer.objective: accuracy`` without
``trainer.staleness_cost``).

The planner's accuracy objective weighs plans by d(τ), what a gradient applied τ updates late is worth in
fresh items (:mod:`ferret_core.planning.staleness_cost`; docs/planner.md reading 13). ``ferret bench`` and
``ferret simulate`` measure d on the head of the stream they will run
(:mod:`ferret_core.engine.staleness_calibration`); a trainer has no stream before it starts, so it
measures d on the first labelled items it receives:

1. **Collect** (the record path's thread, :meth:`LiveCalibration.observe`): copies of the first
   ``trainer.calibration_items`` labelled samples. Until d is known the trainer plans by R_F (the rate
   objective), as the paper does.
2. **Calibrate** (a thread of its own, which runs the calibration in a child process under Linux's
   SCHED_IDLE, so the record path and the executors keep the interpreter and the cores they had): the
   engine on the virtual clock, on those items, for ``trainer.calibration_seeds`` initialisations of the
   trainer's model, at the trainer's lr, without compensation (the cost of uncompensated staleness, as the
   bench calibrates). MNISTNet with 250 items and 3 seeds is 39 runs of 250 items: 36 s alone on this
   2-core machine, the child's start included (12 s with 1 seed). Beside a saturated 2-core trainer it
   took ~2 minutes, and the trainer trained 14–23 % fewer items meanwhile; at nice +10 it was 35–41 %
   (``benchmarks/service/README.md`` "The staleness cost calibrated live").
3. **Re-plan**: the planner is rebuilt with the accuracy objective and d
   (:meth:`~services.trainer.arrivals.SwitchablePlanner.rebuild`, which keeps the arrival drift's own
   changes), and the control plane's re-planner re-plans with the budget in force (None stays
   unconstrained), as a rate re-plan does: versioned, drained, the stall reported.

A calibration that fails (the child dies, the items are too few for the staleness points) is logged and
leaves the trainer on R_F; status says so (``staleness_calibration_state``). The cost is not kept across
restarts (a restarted trainer calibrates again on what it receives then); to fix it, calibrate beforehand
with ``ferret simulate --objective accuracy`` and set ``trainer.staleness_cost``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

import torch
import torch.multiprocessing as tmp

from ferret_core.data import StreamItem
from ferret_core.engine.staleness_calibration import CalibrationSettings, calibrate_staleness
from ferret_core.errors import ConfigError
from ferret_core.planning.planner import PlannerSettings
from ferret_core.planning.staleness_cost import StalenessCost
from services.trainer.arrivals import SwitchablePlanner

log = logging.getLogger("ferret.trainer")

CHILD_NICE = 10  # the calibration's child process yields the cores to the record path and the executors
SEED_BASE = 1000  # the calibration's initialisations: seeds 1000, 1001, … (as ferret simulate's)


class CalibrationState(IntEnum):
    """Where the live calibration is (status ``staleness_calibration_state``)."""

    COLLECTING = 0
    CALIBRATING = 1
    CALIBRATED = 2
    FAILED = 3


@dataclass(frozen=True)
class ModelSpec:
    """What the child process builds the trainer's model from (``services.models.build_model_for``)."""

    model: str
    input_shape: tuple[int, ...]
    num_classes: int
    weights: str | None = None

    def units(self, seed: int) -> list[torch.nn.Module]:
        from services.models import build_model_for  # the child's import; the trainer's is done

        model = build_model_for(self.model, input_shape=self.input_shape, num_classes=self.num_classes, seed=seed,
                                weights=self.weights)  # fmt: skip
        return list(model.units)


Calibrate = Callable[[ModelSpec, Sequence[tuple[torch.Tensor, int]], CalibrationSettings, str], StalenessCost]


def calibrate_here(
    spec: ModelSpec, items: Sequence[tuple[torch.Tensor, int]], settings: CalibrationSettings, source: str
) -> StalenessCost:
    """The calibration in this process (what the child runs; tests call it directly)."""
    head = [StreamItem(i, x, y, 0) for i, (x, y) in enumerate(items)]
    return calibrate_staleness(spec.model, lambda seed: (spec.units(seed), head), settings, source=source)


def lowest_priority() -> str:
    """Make this process run only on CPU time nothing else wants: Linux's SCHED_IDLE where it exists, else
    nice +10; returns which."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except OSError:
            pass
    os.nice(CHILD_NICE)
    return f"nice +{CHILD_NICE}"


def _child(spec: ModelSpec, items: Any, settings: CalibrationSettings, source: str, conn: Any) -> None:
    try:
        lowest_priority()
        torch.set_num_threads(1)
        conn.send(("ok", calibrate_here(spec, items, settings, source).to_dict()))
    except BaseException as exc:  # reported to the trainer, which stays on R_F
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def calibrate_in_child(
    spec: ModelSpec, items: Sequence[tuple[torch.Tensor, int]], settings: CalibrationSettings, source: str
) -> StalenessCost:
    """The calibration in a spawned child process at the lowest priority (:func:`lowest_priority`) on one
    torch thread (the default runner)."""
    ctx = tmp.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(spec, list(items), settings, source, theirs), daemon=True,
                        name="ferret-staleness-calibration")  # fmt: skip
    child.start()
    theirs.close()
    try:
        kind, value = ours.recv()
    except EOFError:
        child.join(5)
        raise RuntimeError(f"the calibration process exited with code {child.exitcode} before answering") from None
    finally:
        child.join(5)
    if kind != "ok":
        raise RuntimeError(f"the calibration process failed: {value}")
    return StalenessCost.from_dict(value)


class LiveCalibration:
    """Collects the stream's head, calibrates d(τ) on it and re-plans with the accuracy objective (module
    docstring). ``items``: labelled samples to collect; ``settings``: the calibration's points, seeds, lr
    and compensator; ``calibrate``: the runner (default: a child process)."""

    def __init__(
        self,
        planners: SwitchablePlanner,
        budget: Callable[[], int | None],
        spec: ModelSpec,
        *,
        items: int,
        settings: CalibrationSettings,
        source: str,
        calibrate: Calibrate = calibrate_in_child,
    ) -> None:
        least = 2 * (max(settings.staleness) + 1)
        if items < least:
            raise ConfigError(
                f"the staleness calibration needs at least {least} items for staleness up to "
                f"{max(settings.staleness)}, got {items}; raise trainer.calibration_items"
            )
        self.planners = planners
        self.budget = budget
        self.spec = spec
        self.wanted = items
        self.settings = settings
        self.source = source
        self.calibrate = calibrate
        self.state = CalibrationState.COLLECTING
        self.cost: StalenessCost | None = None
        self.error: str | None = None
        self.request: Callable[[int | None], object] | None = None
        self._items: list[tuple[torch.Tensor, int]] = []
        self.collected = 0
        self._thread: threading.Thread | None = None
        self.done = threading.Event()  # calibrated (and re-plan requested) or failed

    def start(self, request: Callable[[int | None], object]) -> LiveCalibration:
        """Re-plan through ``request(budget)`` (the control plane's re-planner) once calibrated."""
        self.request = request
        return self

    def observe(self, x: torch.Tensor, y: int | None) -> None:
        """From the loop thread, per valid arrival: keep a copy of a labelled one while collecting; the
        last one starts the calibration. Never blocks."""
        if y is None or self.state is not CalibrationState.COLLECTING:
            return
        self._items.append((x.detach().clone(), int(y)))
        self.collected = len(self._items)
        if self.collected >= self.wanted:
            self.state = CalibrationState.CALIBRATING
            self._thread = threading.Thread(target=self._run, name="ferret-staleness-calibration", daemon=True)
            self._thread.start()

    def counters(self) -> dict[str, int]:
        """Status counters: the state and the head items collected."""
        return {"staleness_calibration_state": int(self.state), "staleness_calibration_items": self.collected}

    def close(self, timeout: float = 1.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)  # a daemon: a calibration still running ends with the trainer

    def _run(self) -> None:
        items, self._items = self._items, []  # the head is the calibration's now (freed after it)
        log.info("calibrating the cost of staleness on the stream's first %d labelled items", len(items))
        try:
            cost = self.calibrate(self.spec, items, self.settings, self.source)
            self.cost = cost

            def change(settings: PlannerSettings) -> PlannerSettings:
                return replace(settings, objective="accuracy", staleness_cost=cost)

            self.planners.rebuild(change)
            self.state = CalibrationState.CALIBRATED
            log.info(
                "staleness cost calibrated: d(τ) = %s at τ = %s; re-planning by the accuracy objective",
                [round(w, 3) for w in cost.worth],
                [int(t) for t in cost.staleness],
            )
            if self.request is not None:
                self.request(self.budget())
        except Exception as exc:  # the trainer plans on by R_F
            self.error = f"{type(exc).__name__}: {exc}"
            self.state = CalibrationState.FAILED
            log.error("the staleness calibration failed, planning on by R_F: %s", self.error)
        finally:
            self.done.set()
