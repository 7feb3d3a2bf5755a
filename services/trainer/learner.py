"""What the trainer's record path needs from the learning engine: the :class:`Learner` contract and the
frozen values it returns.

The record path hands every valid item to :meth:`Learner.arrive`: the master predicts it, then it is
dispatched for training or skipped, and ``arrive`` returns one :class:`ArrivalOutcome` saying which. The
outcome is settled when ``arrive`` returns (training goes on in the background, or between batches on the
loop's thread: :meth:`Learner.train_step`), so an item's offset is finished once its prediction is
delivered. Snapshots drain the learner first, so their offsets cover exactly the work the weights reflect
(DESIGN §4).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ferret_core.engine import SkipReason
from ferret_core.errors import FerretError
from ferret_core.plan import Plan

if TYPE_CHECKING:
    from ferret_core.engine.processes.hosts import Freshness


class LearnerFailed(FerretError, RuntimeError):
    """The learner failed while ``item`` was being predicted or trained (the item whose pipeline action
    raised, which may be an earlier arrival than the one that reported it): the record path blames that
    item's record (:mod:`services.trainer.failures`, poison records). The cause is chained."""

    def __init__(self, item: int, cause: BaseException) -> None:
        super().__init__(f"the learner failed on item {item}: {type(cause).__name__}: {cause}")
        self.item = item


class ModelDivergedError(FerretError, ArithmeticError):
    """The master's output for an in-range input is not finite although its weights are: training has
    diverged (weights grown until a forward pass overflows float32; docs/reliability.md). The record path
    dead-letters the record (reason ``ModelDivergedError``; no prediction with a NaN confidence is ever
    published) and the stream goes on; the message names the largest weight and the fix."""

    def __init__(self, item: int, largest_weight: float, lr: float) -> None:
        super().__init__(
            f"the model diverged: its output for item {item} is not finite (largest |weight| {largest_weight:.3g}, "
            f"trainer.lr {lr:g}); expected finite logits. Lower trainer.lr, or scale the inputs down "
            f"(trainer.input_normaliser: minmax, or a smaller trainer.input_range), then restore a snapshot from "
            f"before the divergence and replay the dead letters"
        )
        self.item = item
        self.largest_weight = largest_weight


@dataclass(frozen=True, slots=True)
class ArrivalOutcome:
    """One item's prediction and training decision: dispatched to ``worker``, or ``skipped`` with the
    core's reason (exactly one of the two is set). ``top_k``: the most probable classes as (class,
    probability), most probable first, as many as the learner was asked for (empty: not reported)."""

    predicted_class: int
    confidence: float
    model_version: int  # optimizer updates applied to the weights that predicted
    skipped: SkipReason | None
    worker: int | None
    top_k: tuple[tuple[int, float], ...] = ()
    model_lineage: int = 0  # the lineage model_version counts along (services.trainer.lineage)

    @property
    def dispatched(self) -> bool:
        return self.skipped is None


@dataclass(frozen=True, slots=True)
class LearnerStats:
    """Cheap counters of a learner, named as in the trainer's status (and its proto, metrics)."""

    backward_passes: int  # items back-propagated at one stage at least, since the start
    model_version: int  # optimizer updates applied to the master, along model_lineage
    measured_bytes: int  # measured peak under the plan in force (0 when not measured)
    peak_bytes: int  # measured peak since the start, across plans
    mean_staleness: float | None = None  # of applied gradients, over the stages; None when unknown
    planned_bytes: int | None = None  # the method's own planned bytes (a schedule's); None: the plan's
    max_staleness: tuple[int, ...] = ()  # per stage, under the plan in force
    staleness_bound: tuple[int, ...] = ()  # per stage, the schedule's bound of the plan in force
    compensations_truncated: int = 0  # compensations cut short (staler than the deltas kept), since start
    non_finite: int = 0  # items whose non-finite loss or gradient was dropped (skipped ``non_finite``)
    guard: GuardCounts | None = None  # the guard's counters (services/trainer/guard); None: not guarded
    model_lineage: int = 0  # the lineage model_version counts along (services.trainer.lineage)
    # over several hosts: how far behind the newest master the predicting follower copies were; None: the
    # predictions read the master itself (one host: always fresh)
    freshness: Freshness | None = None


@dataclass(frozen=True, slots=True)
class GuardCounts:
    """The guard's counters (:mod:`services.trainer.guard.learner`), in the trainer's status and metrics."""

    rollbacks: int = 0  # the live model rolled back to the last-good one
    promotions: int = 0  # the live model's weights made last-good
    drifts: int = 0  # drifts detected on the prediction outcomes
    last_good_version: int = 0  # the model version of the last-good weights
    shadow_items: int = 0  # items the last-good model predicted beside the live one
    shadow_seconds: float = 0.0  # their cost, on the record path's thread


def settled(outcome: ArrivalOutcome) -> Callable[[], ArrivalOutcome]:
    """A :meth:`Learner.submit` result that is already decided."""
    return lambda: outcome


class Learner(Protocol):
    """The learning engine as the trainer drives it (the loop thread calls ``arrive``)."""

    @property
    def plan(self) -> Plan:
        """The plan the learner executes (for methods that do not plan: their fixed plan)."""
        ...

    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        """Predict item i (the trainer's counter of valid arrivals) with the master, then dispatch it or
        skip it; return as soon as that is decided (training goes on in the background). ``event_time_ms``
        (the producer's stamp): admission judges the item by it, not by when Kafka delivered it."""
        ...

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        """:meth:`arrive` in two halves: queue the item now, return a call that waits for its outcome.
        The record path submits a whole consumer batch before waiting for the first outcome, so a backlog
        is predicted together (items are predicted and dispatched in submission order). A learner with
        nothing to queue returns its settled outcome (:func:`settled`)."""
        ...

    def pending_training(self) -> bool:
        """Whether the learner trains on the caller's thread (``trainer.training_thread``) and has admitted
        work left: the loop then polls Kafka without waiting and calls :meth:`train_step` between batches."""
        ...

    def train_step(self) -> bool:
        """Where the learner trains on the caller's thread: run one training action (a forward or backward
        pass of one stage) and return true; false when none was ready or the learner trains on threads of
        its own (a no-op)."""
        ...

    def measured_service_times(self) -> list[float | None]:
        """Per worker, its measured busy seconds per item at its slowest stage (None: not measured yet);
        the live planner compares them with the profile (docs/planner.md reading 11)."""
        ...

    def drain(self, timeout: float | None = None) -> None:
        """Block until every dispatched item's work is reflected in the weights (``TimeoutError`` after
        ``timeout`` seconds)."""
        ...

    def apply_plan(self, plan: Plan) -> None:
        """Swap to ``plan`` (called drained): weights carry over, workers and stages are rebuilt."""
        ...

    def state_tensors(self) -> dict[str, torch.Tensor]: ...

    def master_tensors(self) -> dict[str, torch.Tensor]:
        """Copies of the master's tensors as :meth:`state_tensors` names them (``model.*`` and
        ``engine.updates``), taken now without draining: the weights that predict at this moment (the model
        stream publishes them, services/trainer/model_updates.py). No side effect on the learner."""
        ...

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None: ...

    def compensator_state(self) -> list[dict[str, Any]]:
        """Per stage, the compensator's ``state_dict()`` (tensors inside; empty without compensators)."""
        ...

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        """Restore :meth:`compensator_state` under the same plan and compensator (``ConfigError`` else)."""
        ...

    def stats(self) -> LearnerStats: ...

    def close(self) -> None: ...
