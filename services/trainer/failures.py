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

The default rules (:data:`DEFAULT_RULES`), by where the failure happened:

==================  =========  ===============================================================================
``consume``         SKIP       the broker reported an error instead of a record (there is no record to keep)
``decode``          DEAD_LETTER the value is not a valid sample for this model (the codec's reason code)
``label``           SKIP       an undecodable label: the label is lost, the stream goes on
``deliver``         HOLD       a prediction was not delivered: read it again after a restart
``dead_letter``     HOLD       a dead letter was not delivered: read the record again after a restart
``arrive``          STOP       the learner failed (a pipeline thread raised): the trainer cannot learn on
``publish``         STOP       the producer refused a prediction (e.g. its queue is full)
==================  =========  ===============================================================================

Fault handling grows here (poison records, duplicates, producer rebuilds, lag): a rule changes, or a
policy subclass decides from the failure's history, and the record path stays as it is.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from ferret_core.errors import FerretError

log = logging.getLogger("ferret.trainer")


class Step(enum.StrEnum):
    """Where on the record path a failure happened."""

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


DEFAULT_RULES: Mapping[Step, Decision] = {
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


class ErrorPolicy:
    """Logs every record failure once, with its topic, partition and offset, and decides (module
    docstring). ``rules`` override :data:`DEFAULT_RULES` per step."""

    def __init__(self, rules: Mapping[Step, Decision] | None = None) -> None:
        self.rules = {**DEFAULT_RULES, **(rules or {})}

    def decide(self, failure: RecordFailure) -> Decision:
        decision = self.rules[failure.step]
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
