"""Guarded updates: :class:`GuardedLearner` wraps either learner (executor threads or processes) behind the
same :class:`~services.trainer.learner.Learner` contract and adds

1. **a shadow** (:mod:`.shadow`): the last-good weights predict every ``guard.shadow_every``-th item whose
   label is known at arrival, batched with the consumer batch the item came in;
2. **two rollback rules**, either of which rolls the live model back (its model version goes back, so the
   predictions that follow carry it): the test of :mod:`.cusum` (a CUSUM of Wald's SPRT on the discordant
   pairs of live-vs-shadow correctness: the live model is worse than the shadow), and the recurrence rule
   of :mod:`.recurrence` (the shadow's accuracy fell and came back — a burst ended — and the shadow beats the
   live model since the return: Wald's SPRT on the same pairs, from the return on). A rollback goes to the
   newest weights known to predate the shadow's fall where the watch saw one (a candidate on probation),
   else to the last-good. At the return itself, the recall test (:mod:`.recall`) compares the live model with
   those weights on labelled items kept from before the fall, and rolls back at once if they beat it;
3. **promotion, one window late, on probation for suspect windows**: every ``guard.window`` compared items
   the live model is judged on the window (live correct ≥ shadow correct: at least as good). The weights
   that *started* a passing window (kept at the window's start, the candidate) are promoted, and the live
   weights at its end become the next candidate. Promoting the weights that were followed by a whole
   window at least as good as the shadow, rather than the weights at the moment of the verdict, keeps a
   poisoning burst that began late in a window (its damage not yet visible) out of the last-good copy. A
   *suspect* window — the shadow's accuracy fell during it or has not come back (a burst or a drift may be
   under way) — puts its candidate on probation instead (so does any window while older candidates wait,
   so they are promoted in order; ``guard.probation: always``: every window): it
   becomes last-good only after ``guard.probation_items`` further compared items during which no rule
   fired; a rollback drops every candidate on probation. Why: while a burst of flipped labels lasts, the
   live model fits them better than the shadow (as under a genuine change of concept), so the windows of
   the burst pass; promoted at once, the flip-trained weights became last-good before the true labels
   returned, and the pre-burst model was gone. On probation, the pre-burst weights are still there when
   the labels return; under a permanent drift the live model keeps winning, nothing fires and promotion
   is only delayed. Windows of a clean stream are promoted at their verdict, so the shadow stays about a
   window behind the live model (a stale shadow makes a rollback lose what was learnt since). Candidates
   on probation are kept as copies of the weights (at most ⌈probation_items / window⌉ of them);
4. **drift detection** (:mod:`.drift`, River's ADWIN or Page-Hinkley) on the live model's correctness
   (labelled items) and confidence (unlabelled ones), with an optional reaction;
5. **a rollback on divergence**: a :class:`~services.trainer.learner.ModelDivergedError` (a non-finite
   output: the record is dead-lettered by the record path) rolls back at once.

Rollbacks, promotions and drifts are counted (:meth:`stats`), logged, and queued as
:class:`~.events.ModelEvent` for ``<prefix>.events`` (:meth:`take_events`, read by the record path).

A rollback or promotion swaps weights, which must not happen while items submitted to the inner learner
wait for their outcomes (the record path submits a consumer batch, then waits for each outcome): a
decision is carried out at the next :meth:`submit` or :meth:`pending_training` with no outcome
outstanding, i.e. between consumer batches on the loop thread. The shadow and the test run on the loop
thread only. Labels that arrive later on ``<prefix>.labels``: once the first one has been joined, the
shadow also predicts unlabelled items and keeps its class (the last :data:`MAX_AWAITED_LABELS`) until the
item's label comes (:meth:`GuardedLearner.late_label`); the drift detector sees their confidence.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.zoo import ZooModel
from services.config.sections import GuardSettings
from services.kafka.record_codec import now_ms
from services.trainer.guard.cusum import CusumSettings, DiscordantCusum, Verdict
from services.trainer.guard.drift import DriftMonitor, DriftSignal
from services.trainer.guard.events import ModelEvent
from services.trainer.guard.recall import RecallBuffer, recall_test
from services.trainer.guard.recurrence import Recurrence, RecurrenceWatch, Returned
from services.trainer.guard.shadow import Shadow, cloned
from services.trainer.learner import ArrivalOutcome, GuardCounts, Learner, LearnerStats, ModelDivergedError

log = logging.getLogger("ferret.trainer.guard")

MAX_QUEUED_EVENTS = 1000  # events not yet taken by the record path (the oldest are dropped beyond)
MAX_AWAITED_LABELS = 10_000  # unlabelled items whose shadow class waits for a late label (trainer.label_window)


@dataclass(frozen=True, slots=True)
class _OnProbation:
    """A candidate whose window passed: last-good once ``due`` compared items have been seen quietly."""

    tensors: dict[str, torch.Tensor]
    due: int  # the count of compared items at which it is promoted
    account: str  # the window's verdict, for the promotion's event
    taken_at: int  # the count of compared items when these weights were the live ones (the window's start)
    waited: bool = True  # on probation (False: promoted at its verdict)


@dataclass(slots=True)
class _Window:
    """The current promotion window's counts."""

    items: int = 0
    live_correct: int = 0
    shadow_correct: int = 0
    suspect: bool = False  # the shadow's concept was away at some point of the window (a burst or a drift)


class GuardedLearner:
    """Implements :class:`~services.trainer.learner.Learner` around ``inner`` (module docstring)."""

    def __init__(self, inner: Learner, model: ZooModel, settings: GuardSettings) -> None:
        self.inner = inner
        self.settings = settings
        self._test = DiscordantCusum(CusumSettings(settings.false_alarm, settings.worse_share, settings.min_drop))
        self._returns = RecurrenceWatch(settings.recurrence_level, settings.worse_share, settings.window)
        self._model = model
        self._recall = RecallBuffer(settings.recall_items if settings.recurrence_level > 0 else 0)
        self._judge: Shadow | None = None  # the model the recall test loads each side's weights into (made once)
        # the recall buffer's candidates: queued items' (x, y) until compared, then unlabelled items' x until
        # their late label comes (the newest 2 × recall_items of them)
        self._arrived: dict[int, tuple[torch.Tensor, int | None]] = {}
        self._late_x: OrderedDict[int, torch.Tensor] = OrderedDict()
        start = inner.state_tensors()
        self._shadow = Shadow(model, start)
        self._candidate = cloned(start)
        self._candidate_at = 0  # the count of compared items when the candidate's weights were taken
        self._candidate_void = False  # the candidate was trained while the shadow's concept was away: never promoted
        # the compensators' state (λ, moments) at the start: a rollback puts it back (what they learnt from the
        # gradients since the last-good is dropped with the weights), and so does guard.drift_reaction
        self._start_compensators = inner.compensator_state()
        self._drift = None if settings.drift_detector == "none" else DriftMonitor(settings.drift_detector)
        self._window = _Window()
        self._compared = 0  # labelled items the shadow and the live model both predicted (the test's clock)
        self._probation: deque[_OnProbation] = deque()  # oldest first
        self._labelled = 0  # items the shadow may predict (labelled at arrival, or any once labels come late)
        self._late_labels = False  # a late label has been joined: the shadow predicts unlabelled items too
        self._late: OrderedDict[int, int] = OrderedDict()  # item -> the shadow's class, awaiting its late label
        self._queued: list[tuple[int, torch.Tensor]] = []  # (item, x) waiting for the shadow's forward
        self._shadow_says: dict[int, int] = {}  # item -> the shadow's class
        self._outstanding = 0
        # (deciding item, why, where the shadow's accuracy fell: the compared count, None when it did not)
        self._rollback_due: tuple[int, str, int | None] | None = None
        self._recall_due: tuple[int, Returned] | None = None  # a return to test on the kept items (between batches)
        self._verdict_due: tuple[int, bool, str, bool] | None = None  # (deciding item, passed, account, suspect)
        self._promotion_due: tuple[int, _OnProbation] | None = None  # (item, the candidate whose probation ended)
        self._reset_due = False  # a drift asked for the compensators' reset (guard.drift_reaction)
        self._events: deque[ModelEvent] = deque(maxlen=MAX_QUEUED_EVENTS)
        self._counts = GuardCounts(last_good_version=self._shadow.version)

    # -- the record path's calls -------------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self.inner.plan

    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        return self.submit(item, x, y, event_time_ms)()

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        self._carry_out()
        waiting = self.inner.submit(item, x, y, event_time_ms)
        if y is not None or self._late_labels:  # unlabelled ones once labels have come late
            self._labelled += 1
            if self._labelled % self.settings.shadow_every == 0:
                self._queued.append((item, x))
                if self._recall.capacity:
                    self._arrived[item] = (x, y)
        self._outstanding += 1
        settled = False

        def outcome() -> ArrivalOutcome:
            nonlocal settled
            try:
                result = waiting()
            except ModelDivergedError as exc:
                self._arrived.pop(item, None)
                diverged = (item, f"the live model diverged ({exc})", self._returns.fell_from)
                self._rollback_due = self._rollback_due or diverged
                raise
            finally:
                if not settled:
                    settled = True
                    self._outstanding -= 1
            self._observe(item, y, result)
            return result

        return outcome

    def pending_training(self) -> bool:
        self._carry_out()
        return self.inner.pending_training()

    def train_step(self) -> bool:
        return self.inner.train_step()

    def measured_service_times(self) -> list[float | None]:
        return self.inner.measured_service_times()

    def trace_view(self) -> dict[str, float | int | None]:
        view = getattr(self.inner, "trace_view", None)
        return {} if view is None else dict(view())

    def drain(self, timeout: float | None = None) -> None:
        self.inner.drain(timeout)

    def apply_plan(self, plan: Plan) -> None:
        self.inner.apply_plan(plan)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.inner.state_tensors()

    def master_tensors(self) -> dict[str, torch.Tensor]:
        return self.inner.master_tensors()  # the live model's weights: what predicts (and what serving follows)

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """A restore: the restored weights are the new last-good (the snapshot was taken of a running model;
        a restored model has nothing to be compared with until it trains on)."""
        self.inner.load_state_tensors(tensors)
        self._restart(self.inner.state_tensors())

    def compensator_state(self) -> list[dict[str, Any]]:
        return self.inner.compensator_state()

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        self.inner.load_compensator_state(states)

    def stats(self) -> LearnerStats:
        return replace(self.inner.stats(), guard=self._counts)

    def close(self) -> None:
        self.inner.close()

    # -- events ----------------------------------------------------------------------------------------
    def take_events(self) -> list[ModelEvent]:
        """The events since the last call, oldest first (the record path publishes them)."""
        out = list(self._events)
        self._events.clear()
        return out

    # -- the guard -------------------------------------------------------------------------------------
    def _observe(self, item: int, y: int | None, outcome: ArrivalOutcome) -> None:
        """After the live outcome of ``item``: the shadow's verdict on it (batched), the test, the window,
        the drift detectors."""
        live_correct = None if y is None else outcome.predicted_class == y
        if self._drift is not None:
            signal = self._drift.observe(item, live_correct, outcome.confidence)
            if signal is not None:
                self._drifted(signal, outcome.model_version)
        if y is None or live_correct is None:
            self._await_label(item)
            return
        shadow_class = self._shadow_class(item)
        arrived = self._arrived.pop(item, None)
        if shadow_class is not None:
            self._compare(item, live_correct, shadow_class == y)
            if arrived is not None:
                self._keep_for_recall(arrived[0], y)

    def _keep_for_recall(self, x: torch.Tensor, y: int) -> None:
        """The item just compared, for the recall test, if the shadow's concept is present (not during a
        suspected burst or drift, and not once the live model is condemned)."""
        if not self._returns.suspect and self._rollback_due is None:
            self._recall.keep(self._compared, x, y)

    def late_label(self, item: int, label: int, live_correct: bool) -> None:
        """A label that came after its prediction (``<prefix>.labels``, joined by the record path): the
        item is compared as if labelled at arrival, if the shadow predicted it and neither model has changed
        hands since (a promotion, rollback or restore forgets the awaited items: their predictions were
        made by models no longer compared). The first such label makes the shadow predict unlabelled items
        from then on."""
        self._late_labels = True
        shadow_class = self._late.pop(item, None)
        x = self._late_x.pop(item, None)
        if shadow_class is not None:
            self._compare(item, live_correct, shadow_class == label)
            if x is not None:
                self._keep_for_recall(x, label)

    def _await_label(self, item: int) -> None:
        """An unlabelled item: keep the shadow's class (if it predicted the item) for a late label, and its
        input for the recall buffer."""
        shadow_class = self._shadow_class(item)
        arrived = self._arrived.pop(item, None)
        if shadow_class is None:
            return
        if arrived is not None:
            self._late_x[item] = arrived[0]
            while len(self._late_x) > 2 * self._recall.capacity:
                self._late_x.popitem(last=False)
        self._late[item] = shadow_class
        while len(self._late) > MAX_AWAITED_LABELS:
            self._late.popitem(last=False)

    def _compare(self, item: int, live_correct: bool, shadow_correct: bool) -> None:
        """One item both models predicted, judged: the rollback rules, the window, the probation."""
        if self._rollback_due is not None:  # the live model is condemned already
            return
        w = self._window
        w.items += 1
        w.live_correct += live_correct
        w.shadow_correct += shadow_correct
        self._compared += 1
        if self._test.observe(live_correct, shadow_correct) is Verdict.WORSE:
            self._rollback_due = (item, self._test.describe(), self._returns.fell_from)
            return
        seen = self._returns.observe(item, live_correct, shadow_correct, self._compared)
        if isinstance(seen, Recurrence):
            self._rollback_due = (item, seen.describe(), seen.returned.fell_from)
            return
        if isinstance(seen, Returned):
            self._drop_trained_while_away(seen)
            if self._recall.capacity:
                self._recall_due = (item, seen)
        fell_from = self._returns.fell_from
        if fell_from is not None:
            self._recall.drop_after(fell_from)  # compared after the fall began: the burst's, not the concept's
        w.suspect = w.suspect or self._returns.suspect
        if w.items >= self.settings.window:  # judged now, carried out between batches; the next window starts
            passed = w.live_correct >= w.shadow_correct
            account = f"window of {w.items}: live {w.live_correct} vs shadow {w.shadow_correct} right"
            if w.suspect:
                account += " (the shadow's accuracy fell during it)"
            self._verdict_due = (item, passed, account, w.suspect)
            self._window = _Window()
        if self._probation and self._probation[0].due <= self._compared and self._promotion_due is None:
            self._promotion_due = (item, self._probation.popleft())

    def _drop_trained_while_away(self, returned: Returned) -> None:
        """The shadow's concept came back: weights taken after its fall began were trained on what made it
        leave (a burst, most likely) and must not become last-good; the candidates on probation among them
        are dropped, and so is the current candidate if it is one of them (its window promotes nothing)."""
        kept = deque(c for c in self._probation if c.taken_at <= returned.fell_from)
        dropped = len(self._probation) - len(kept)
        self._probation = kept
        if self._promotion_due is not None and self._promotion_due[1].taken_at > returned.fell_from:
            self._promotion_due, dropped = None, dropped + 1
        if self._candidate_at > returned.fell_from:
            self._candidate_void, dropped = True, dropped + 1
        if dropped:
            log.info(
                "the shadow's concept came back at item %d (it left at item %d): %d candidate(s) trained while it "
                "was away dropped", returned.item, returned.fell_at, dropped,
            )  # fmt: skip

    def _shadow_class(self, item: int) -> int | None:
        """The shadow's class for ``item``; the first call after a submission predicts every queued item in
        one forward pass."""
        if self._queued:
            began = time.perf_counter()
            items = [i for i, _ in self._queued]
            classes = self._shadow.predict(torch.stack([x for _, x in self._queued]))
            self._shadow_says.update(zip(items, classes, strict=True))
            c = self._counts
            self._counts = replace(
                c,
                shadow_items=c.shadow_items + len(items),
                shadow_seconds=c.shadow_seconds + time.perf_counter() - began,
            )
            self._queued.clear()
        return self._shadow_says.pop(item, None)

    def _carry_out(self) -> None:
        """The decisions waiting, now that no outcome is outstanding (module docstring)."""
        if self._outstanding:
            return
        if self._reset_due:
            self._reset_due = False
            self._reset_compensators()
        if self._recall_due is not None:
            recall, self._recall_due = self._recall_due, None
            if self._rollback_due is None:
                self._recall_check(*recall)
        rollback, verdict, promotion = self._rollback_due, self._verdict_due, self._promotion_due
        self._rollback_due = self._verdict_due = self._promotion_due = None
        if rollback is not None:  # verdicts and promotions decided before it are moot: the candidates dropped
            if promotion is not None:  # still a candidate the rollback may return to
                self._probation.appendleft(promotion[1])
            self._rollback(*rollback)
            return
        if promotion is not None:  # before the verdict: a candidate it puts on probation is younger
            self._promote(*promotion)
        if verdict is not None:
            self._judged(*verdict)

    def _before_the_fall(self, fell_from: int | None) -> _OnProbation | None:
        """The newest candidate on probation taken at or before ``fell_from`` (None: the last-good is the
        newest weights known to predate the fall)."""
        waiting = ([self._promotion_due[1]] if self._promotion_due is not None else []) + list(self._probation)
        older = [c for c in waiting if fell_from is not None and c.taken_at <= fell_from]
        return older[-1] if older else None

    def _recall_check(self, item: int, returned: Returned) -> None:
        """The recall test at a return (:mod:`.recall`): the live weights against those a rollback would go to,
        on the items kept from before the fall; a rollback is due if the live model is worse."""
        test = self._returns.settings  # the recurrence rule's SPRT
        kept = self._recall.before(returned.fell_from)
        if test is None or kept is None:  # the rule is off (level 0): so is the recall test, its buffer empty
            return
        xs, labels = kept
        target = self._before_the_fall(returned.fell_from)
        live_weights = self.inner.master_tensors()  # the weights predicting now (not drained: no side effect)
        if self._judge is None:
            self._judge = Shadow(self._model, live_weights)
        else:
            self._judge.load(live_weights)
        live = self._judge.predict(xs)
        if target is None:
            older = self._shadow.predict(xs)
        else:
            self._judge.load(target.tensors)
            older = self._judge.predict(xs)
        recalled = recall_test(live, older, labels, test)
        log.info("the shadow's concept came back at item %d: %s", item, recalled.describe())
        if recalled.worse:
            detail = (
                f"the shadow's accuracy fell at item {returned.fell_at} and came back at item {returned.item}; "
                + recalled.describe()
            )
            self._rollback_due = (item, detail, returned.fell_from)

    def _rollback(self, item: int, detail: str, fell_from: int | None) -> None:
        """Back to the newest weights known to predate the fall of the shadow's accuracy (a candidate on
        probation taken at or before ``fell_from``, which becomes last-good: :mod:`.recurrence`), else to the
        last-good."""
        before = self.inner.stats().model_version
        older = self._before_the_fall(fell_from)
        if older is not None:
            self._shadow.load(older.tensors)
            detail += f"; to the newest weights from before the fall of the shadow's accuracy ({older.account})"
        tensors = self._shadow.tensors()
        self.inner.load_state_tensors(tensors)
        detail += "; " + self._restore_compensators("rollback")
        self._restart(tensors, promote=False)
        c = self._counts
        self._counts = replace(c, rollbacks=c.rollbacks + 1, last_good_version=self._shadow.version)
        log.warning(
            "rollback at item %d: model v%d -> last-good v%d (%s)", item, before, self._shadow.version, detail
        )
        self._event(ModelEvent("rollback", self._shadow.version, item, now_ms(), before, detail=detail))

    def _judged(self, item: int, passed: bool, detail: str, suspect: bool) -> None:
        """The window that ended at ``item`` judged: the candidate goes on probation if it ``passed`` (or is
        promoted at once with ``guard.probation_items: 0``, or with ``guard.probation: suspect`` when the
        window was not ``suspect``), the live weights become the next candidate. The probation counts from
        now: a verdict is carried out between consumer batches, up to one batch after the window's end."""
        candidate, taken_at, void = self._candidate, self._candidate_at, self._candidate_void
        self._candidate, self._candidate_at = cloned(self.inner.state_tensors()), self._compared
        self._candidate_void = False
        if not passed or void:
            why = "its weights were trained while the shadow's concept was away" if passed else detail
            log.info("no promotion at item %d: %s", item, why)
            return
        on_probation = _OnProbation(candidate, self._compared + self.settings.probation_items, detail, taken_at)
        at_once = self.settings.probation == "suspect" and not suspect and not self._probation
        if self.settings.probation_items == 0 or at_once:
            self._promote(item, replace(on_probation, waited=False))
        else:
            self._probation.append(on_probation)

    def _promote(self, item: int, candidate: _OnProbation) -> None:
        """``candidate`` becomes last-good. The test goes on (its evidence is against the previous last-good,
        an older model: a shadow win then is a shadow win against the candidate too, more often than not)."""
        before = self._shadow.version
        self._shadow.load(candidate.tensors)
        # The recurrence watch goes on (a promotion right before a burst must not hide the fall of the shadow's
        # accuracy: a fresh ADWIN would start inside the burst) unless the new last-good was trained after the
        # fall began: it survived its probation while the old concept stayed away, i.e. a lasting drift, and its
        # accuracy rising on the new concept is not the old one coming back
        fell_from = self._returns.fell_from
        if fell_from is not None and candidate.taken_at > fell_from:
            self._returns.reset()
            self._recall.clear()  # items of the concept that left for good
        self._queued.clear()  # predicted by the shadow being replaced (none are: called between batches)
        self._shadow_says.clear()
        self._late.clear()
        self._late_x.clear()
        detail = candidate.account
        if candidate.waited:
            detail += f"; then {self.settings.probation_items} compared items on probation with no rollback"
        c = self._counts
        self._counts = replace(c, promotions=c.promotions + 1, last_good_version=self._shadow.version)
        log.info("promotion at item %d: last-good v%d -> v%d (%s)", item, before, self._shadow.version, detail)
        self._event(ModelEvent("promotion", self._shadow.version, item, now_ms(), before, detail=detail))

    def _restart(self, tensors: Mapping[str, torch.Tensor], *, promote: bool = True) -> None:
        """After a rollback (the shadow stays) or a restore (``promote``: the weights become last-good). The
        candidates on probation are dropped: they descend from the condemned (or replaced) weights."""
        if promote:  # a restore: the kept items may be of another stream position, or another stream
            self._shadow.load(tensors)
            self._counts = replace(self._counts, last_good_version=self._shadow.version)
            self._recall.clear()
        self._recall_due = None
        self._arrived.clear()
        self._late_x.clear()
        self._candidate, self._candidate_at, self._candidate_void = cloned(tensors), self._compared, False
        self._probation.clear()
        self._verdict_due = self._promotion_due = None
        self._window = _Window()
        self._test.reset()
        self._returns.reset()
        self._queued.clear()
        self._shadow_says.clear()
        self._late.clear()

    def _drifted(self, signal: DriftSignal, model_version: int) -> None:
        reaction = self.settings.drift_reaction
        self._reset_due = reaction == "reset-compensator"
        c = self._counts
        self._counts = replace(c, drifts=c.drifts + 1)
        detail = f"{signal.detector} detected a change at item {signal.item} (mean after: {signal.estimate:.3f})"
        log.warning("drift: %s; reaction: %s", detail, reaction)
        self._event(ModelEvent("drift", model_version, signal.item, now_ms(), detector=signal.detector,
                               reaction=reaction, detail=detail))  # fmt: skip

    def _reset_compensators(self) -> None:
        """``guard.drift_reaction: reset-compensator``: the compensators' state (λ, moments) as at the start,
        so what they learnt of the old concept does not correct gradients of the new one."""
        log.info("drift reaction: %s", self._restore_compensators("drift reaction reset-compensator"))

    def _restore_compensators(self, why: str) -> str:
        """The compensators' state as at the start (at a rollback: no λ or moment learnt from the gradients of
        the dropped weights stays; the last-good's own state is not kept, the start's is the clean one); what
        happened, for the log and the event."""
        if not self._start_compensators:
            return "no compensator state to reset (the learner exposes none)"
        try:
            self.inner.load_compensator_state(self._start_compensators)
        except ConfigError as exc:  # the plan changed since the start: the start's state no longer fits
            log.warning("%s: compensator state not reset: %s", why, exc)
            return f"compensator state kept (the start's no longer fits the plan: {exc})"
        return "compensator state reset to the start's"

    def _event(self, event: ModelEvent) -> None:
        """Queue ``event`` with the lineage in force after it (a rollback's: the new one its load began)."""
        self._events.append(replace(event, model_lineage=self.inner.stats().model_lineage))
