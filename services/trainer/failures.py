"""The one error policy of the record path (as quix-streams' ``error_callbacks.py``): every per-record
failure becomes a :class:`RecordFailure`, and :meth:`ErrorPolicy.decide` logs it with its topic,
partition and offset and decides what happens to the record. No other site logs a record's failure.

The decisions and what the record path does for each:

=================  =========================================================================================
``DEAD_LETTER``    the original bytes go to ``<prefix>.samples.dlq`` with the reason in ``ferret.dlq.*``
                   headers; the offset is finished once the dead letter is delivered
``SKIP``           the record is given up: its offset is finished now (nothing will read it again)
``HOLD``           the offset stays unfinished: offsets of its partition are not stored past it, so a
                   restart reads it again (at least once)
``STOP``           the record path raises :class:`RecordPathStopped`; the trainer drains, snapshots,
                   commits what is finished and exits with the failure
=================  =========================================================================================

The default rules (:data:`DEFAULT_RULES`), by where the failure happened (a ``(step, reason)`` rule
overrides the step's):

=============================  ===========  ====================================================================
``receive``, ``poison``        DEAD_LETTER  the record failed ``trainer.max_record_failures`` times before
                                            (below): it goes to the DLQ with the last exception's text
``consume``                    SKIP         the broker reported an error instead of a record (no record to keep)
``decode``                     DEAD_LETTER  the value is not a valid sample for this model (the codec's reason)
``label``                      SKIP         an undecodable label: the label is lost, the stream goes on
``publish``, ``too_large``     DEAD_LETTER  the prediction exceeds the producer's ``message.max.bytes``
``deliver``, ``too_large``     DEAD_LETTER  … or the broker's limit
``deliver``                    HOLD         a prediction was not delivered: read it again after a restart
``dead_letter``, ``too_large`` SKIP         even the truncated dead letter is refused: given up, logged
``dead_letter``                HOLD         a dead letter was not delivered: read the record again after a restart
``arrive``, model diverged     DEAD_LETTER  reason ``ModelDivergedError``: the master's output is not finite
                                            (training diverged), no prediction to publish; DLQ with the fix
``arrive``, executor lost     STOP         an executor process died (kill -9, the OOM killer): not counted against
                                            the record (no poison); its supervisor restarts the trainer, which
                                            resumes from the last snapshot and committed offsets
``arrive``                     STOP         the learner failed (a pipeline thread raised): the trainer cannot learn on
``publish``                    STOP         the producer refused a prediction (after its rebuild, or a full queue
                                            for :data:`services.trainer.publisher.QUEUE_FULL_WAIT_S`)
=============================  ===========  ====================================================================

**Poison records.** A STOP ends the process, so a record that makes the learner (or the producer) fail
would fail again after every restart. Each STOP is therefore counted against the record it is blamed on
(the record whose item the failing pipeline action ran, else the record being processed) in a
:class:`FailureLog` that outlives the process (:class:`services.trainer.failure_log.RedisFailureLog`);
once a record has failed ``max_failures`` times it is not given to the learner again: it fails at
``receive`` with reason ``poison`` and the stored exception text, and is dead-lettered. A record therefore
ends at most ``max_failures`` restarts, never a crash loop. Without a log that outlives the process (Redis
down) the count restarts with it (logged).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ferret_core.errors import FerretError

log = logging.getLogger("ferret.trainer")


class Step(enum.StrEnum):
    """Where on the record path a failure happened."""

    RECEIVE = "receive"
    CONSUME = "consume"
    DECODE = "decode"
    LABEL = "label"
    ARRIVE = "arrive"
    PUBLISH = "publish"
    DELIVER = "deliver"
    DEAD_LETTER = "dead_letter"


class Decision(enum.StrEnum):
    DEAD_LETTER = "dead_letter"
    SKIP = "skip"
    HOLD = "hold"
    STOP = "stop"


@dataclass(frozen=True)
class RecordFailure:
    """A failure of one record: where (``step``), which record, a stable ``reason`` code and a detail."""

    step: Step
    topic: str
    partition: int
    offset: int
    reason: str
    detail: str
    error: BaseException | None = None

    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


class RecordPathStopped(FerretError, RuntimeError):
    """The error policy stopped the record path on a failure (the cause is chained)."""

    def __init__(self, failure: RecordFailure) -> None:
        self.failure = failure
        super().__init__(f"{failure.step} failed for {failure.where()}: {failure.reason}: {failure.detail}")


POISON = "poison"  # the reason of a record that failed max_failures times
TOO_LARGE = "too_large"
MODEL_DIVERGED = "ModelDivergedError"  # services.trainer.learner.ModelDivergedError (reason: the class name)
EXECUTOR_LOST = "ExecutorLost"  # ferret_core.errors.ExecutorLost: a process died, no record's doing
NOT_THE_RECORDS = frozenset({EXECUTOR_LOST})  # STOP reasons never counted against the record (poison)
DEFAULT_MAX_FAILURES = 3

Rule = Step | tuple[Step, str]
DEFAULT_RULES: Mapping[Rule, Decision] = {
    (Step.RECEIVE, POISON): Decision.DEAD_LETTER,
    (Step.PUBLISH, TOO_LARGE): Decision.DEAD_LETTER,
    (Step.DELIVER, TOO_LARGE): Decision.DEAD_LETTER,
    (Step.DEAD_LETTER, TOO_LARGE): Decision.SKIP,
    (Step.ARRIVE, MODEL_DIVERGED): Decision.DEAD_LETTER,
    Step.RECEIVE: Decision.DEAD_LETTER,
    Step.CONSUME: Decision.SKIP,
    Step.DECODE: Decision.DEAD_LETTER,
    Step.LABEL: Decision.SKIP,
    Step.DELIVER: Decision.HOLD,
    Step.DEAD_LETTER: Decision.HOLD,
    Step.ARRIVE: Decision.STOP,
    Step.PUBLISH: Decision.STOP,
}
_LEVELS = {
    Decision.DEAD_LETTER: logging.WARNING,
    Decision.SKIP: logging.WARNING,
    Decision.HOLD: logging.ERROR,
    Decision.STOP: logging.ERROR,
}


class FailureLog(Protocol):
    """Failures per record (``topic/partition/offset``) that outlive the process (module docstring)."""

    def record(self, key: str, error: str) -> int:
        """Count one more failure of ``key`` with its error text; the count so far."""
        ...

    def get(self, key: str) -> tuple[int, str] | None:
        """(failures, the last error text) of ``key``, None when it never failed."""
        ...


class MemoryFailureLog:
    """A :class:`FailureLog` of this process only (tests; the fallback while Redis is down)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, str]] = {}

    def record(self, key: str, error: str) -> int:
        count = self._entries.get(key, (0, ""))[0] + 1
        self._entries[key] = (count, error)
        return count

    def get(self, key: str) -> tuple[int, str] | None:
        return self._entries.get(key)

    def put(self, key: str, count: int, error: str) -> None:
        self._entries[key] = (max(count, self._entries.get(key, (0, ""))[0]), error)


class ErrorPolicy:
    """Logs every record failure once, with its topic, partition and offset, and decides (module
    docstring). ``rules`` override :data:`DEFAULT_RULES` per step or per ``(step, reason)``; ``failures``
    and ``max_failures`` turn a record that failed that often into a poison record."""

    def __init__(
        self,
        rules: Mapping[Rule, Decision] | None = None,
        *,
        failures: FailureLog | None = None,
        max_failures: int = DEFAULT_MAX_FAILURES,
    ) -> None:
        self.rules: dict[Rule, Decision] = {**DEFAULT_RULES, **(rules or {})}
        self.failures = failures if failures is not None else MemoryFailureLog()
        self.max_failures = max_failures

    def rule(self, failure: RecordFailure) -> Decision:
        return self.rules.get((failure.step, failure.reason)) or self.rules[failure.step]

    def poisoned(self, topic: str, partition: int, offset: int) -> RecordFailure | None:
        """A ``receive`` failure for a record that already failed ``max_failures`` times, else None."""
        entry = self.failures.get(_key(topic, partition, offset))
        if entry is None or entry[0] < self.max_failures:
            return None
        count, error = entry
        return RecordFailure(
            Step.RECEIVE,
            topic,
            partition,
            offset,
            POISON,
            f"failed {count} times (the trainer stopped each time); last: {error}",
        )

    def decide(self, failure: RecordFailure) -> Decision:
        decision = self.rule(failure)
        if decision is Decision.STOP and failure.reason not in NOT_THE_RECORDS:
            count = self.failures.record(
                _key(failure.topic, failure.partition, failure.offset), f"{failure.reason}: {failure.detail}"
            )
            log.error("%s has failed %d of %d times", failure.where(), count, self.max_failures)
        log.log(
            _LEVELS[decision],
            "%s failed for %s: %s (%s); %s",
            failure.step,
            failure.where(),
            failure.reason,
            failure.detail,
            decision,
            exc_info=failure.error if decision is Decision.STOP else None,
        )
        return decision


def _key(topic: str, partition: int, offset: int) -> str:
    return f"{topic}/{partition}/{offset}"
