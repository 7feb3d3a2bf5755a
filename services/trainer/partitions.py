"""The sample partitions a replica owns, and what it commits for them (DESIGN §4 "Offsets and snapshots",
"Replicas").

- **Assignment** (:meth:`PartitionOwner.on_assign`): each partition starts at a restored snapshot's offset
  (once), else at the group's committed one. Offsets below the committed one were finished before
  (committed only after delivery); the outcomes an earlier run or owner published at or after it (from the
  outcome partition's beginning where the group committed no position for it yet) are read back
  (:func:`~services.trainer.outcomes.scan_outcomes`), so re-processing any of them publishes an outcome
  flagged duplicate.
- **Revocation** (:meth:`PartitionOwner.on_revoke`): before partitions go to another replica, what is queued
  is delivered and what is finished committed, synchronously; then they are forgotten (ledger, outcome
  positions, lag). The learner is not drained: its weights are this replica's own, and the next owner trains
  its own model. A partition *lost* without a revoke (this member was expelled) is forgotten uncommitted.
- **Commits** (:meth:`PartitionOwner.commit`, every :data:`COMMIT_INTERVAL_S` from the loop): per owned
  sample partition the smallest unfinished offset r, with each aligned outcome topic's position for it
  (:class:`~services.trainer.outcomes.OutcomePositions`), and the labels' offsets; only what changed.
- **Lag** (:meth:`PartitionOwner.measure_lag`): the consumer's positions and cached high watermarks feed
  :class:`~services.trainer.lag.PartitionLag`.

Every method runs on the loop thread (librdkafka calls the rebalance callbacks from ``consume``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from services.config import KafkaSettings
from services.trainer.lag import PartitionLag
from services.trainer.ledger import OffsetLedger
from services.trainer.outcomes import OutcomePositions, OutcomeTopics, scan_outcomes

log = logging.getLogger("ferret.trainer")

COMMIT_INTERVAL_S = 0.2  # a crash re-reads at most this much besides what was in flight (all flagged)
REVOKE_FLUSH_S = 10.0  # deliveries awaited before a revoked partition is committed and let go


def rebalances_incrementally(consumer_config: Mapping[str, object]) -> bool:
    """Whether the consumer's group rebalances incrementally (``partition.assignment.strategy``
    cooperative-sticky; librdkafka refuses a mix with eager assignors): the callbacks then get what is added
    or taken, not the whole assignment. (The Python client does not expose ``rebalance_protocol()``.)"""
    strategies = str(consumer_config.get("partition.assignment.strategy", "range,roundrobin")).split(",")
    return all(name.strip() == "cooperative-sticky" for name in strategies)


class PartitionOwner:
    """Ownership of the sample partitions (module docstring). ``flush(timeout_s)`` delivers queued outcomes
    and returns how many are left; ``on_assigned`` hears the owned sample partitions after each assignment."""

    def __init__(
        self,
        kafka: KafkaSettings,
        ledger: OffsetLedger,
        *,
        flush: Callable[[float], int],
        on_assigned: Callable[[frozenset[int]], None],
    ) -> None:
        self.kafka = kafka
        self.topics = kafka.topics
        self.ledger = ledger
        self.positions = OutcomePositions()
        self.lag = PartitionLag()
        self.assigned: frozenset[int] = frozenset()  # sample partitions this replica owns
        self.outcomes: OutcomeTopics | None = None
        self.consumer: Consumer | None = None
        self._flush = flush
        self._on_assigned = on_assigned
        self._resume_at: dict[int, int] = {}  # from a restored snapshot: where each partition starts (once)
        self._label_next: dict[int, int] = {}  # labels partition -> next offset to commit
        self._committed: list[tuple[str, int, int]] = []
        self.cooperative = rebalances_incrementally(kafka.consumer_config())

    # -- rebalance callbacks -----------------------------------------------------------------------------
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """``partitions`` is the whole assignment (eager protocol) or what it adds (cooperative)."""
        cooperative = self.cooperative
        samples = [tp for tp in partitions if tp.topic == self.topics.samples]
        added = frozenset(tp.partition for tp in samples)
        self.assigned = self.assigned | added if cooperative else added
        self.outcomes = outcomes = self._outcome_topics(consumer)
        outcome_tps = [
            TopicPartition(topic, outcomes.partition_for(topic, tp.partition))
            for topic in outcomes.names
            for tp in samples
            if outcomes.aligned(topic)
        ]
        try:
            committed = consumer.committed(samples + outcome_tps, timeout=10) if samples else []
        except KafkaException as exc:
            log.warning("reading committed offsets failed: %s", exc)
            committed = []
        starts: dict[tuple[str, int], int] = {}
        for tp in committed:
            if tp.offset < 0:
                continue
            if tp.topic == self.topics.samples:
                self.ledger.known_predicted(tp.partition, tp.offset)
                self.ledger.starts_at(tp.partition, self._resume_at.get(tp.partition, tp.offset))
            else:  # aligned: the outcome partition's index is the sample partition's
                starts[(tp.topic, tp.partition)] = tp.offset
                self.positions.known(tp.topic, tp.partition, tp.offset)
        for topic, tp in ((t, tp) for t in outcomes.names for tp in samples if outcomes.aligned(t)):
            # nothing committed for it (a first run, or killed before its first commit): from the beginning
            starts.setdefault((topic, tp.partition), OFFSET_BEGINNING)
        for partition, offsets in scan_outcomes(self.kafka.client_config(), outcomes, starts).items():
            if partition in added:
                self.ledger.published_before(partition, offsets)
        log.debug("assigned %s; committed %s; snapshot offsets %s", partitions, committed, self._resume_at)
        for tp in samples:
            if tp.partition in self._resume_at:
                tp.offset = self._resume_at.pop(tp.partition)
        if cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        self.lag.assigned(self.assigned)
        self._on_assigned(self.assigned)  # readiness: only now can the trainer take the stream

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        left = self._flush(REVOKE_FLUSH_S)
        if left:
            log.warning("%d outcomes undelivered at a rebalance: their records will be read again", left)
        self.commit(sync=True)
        self._let_go(consumer, partitions)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = [f"{tp.topic}[{tp.partition}]" for tp in partitions]
        log.warning("partitions lost (the group expelled this member): %s", lost)
        self._let_go(consumer, partitions)

    def _let_go(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        gone = [tp.partition for tp in partitions if tp.topic == self.topics.samples]
        self.ledger.forget(gone)
        self.positions.forget(gone)
        self.lag.revoked(gone)
        for tp in partitions:
            if tp.topic == self.topics.labels:
                self._label_next.pop(tp.partition, None)
        self.assigned = self.assigned - set(gone)
        self._committed = []
        self._on_assigned(self.assigned)  # readiness: a replica left without partitions goes unready later

    def _outcome_topics(self, consumer: Consumer) -> OutcomeTopics:
        counts: dict[str, int] = {}
        for name in (self.topics.samples, self.topics.predictions, self.topics.dlq):
            try:
                counts[name] = len(consumer.list_topics(name, timeout=10).topics[name].partitions)
            except (KafkaException, KeyError) as exc:
                log.warning("no metadata for %s (%s): its outcomes are not partition-aligned", name, exc)
        topics = OutcomeTopics(
            samples=self.topics.samples,
            predictions=self.topics.predictions,
            dlq=self.topics.dlq,
            partitions=counts,
            sample_partitions=counts.get(self.topics.samples, 1),
        )
        for name in topics.names:
            if name in counts and not topics.aligned(name):
                log.warning(
                    "%s has %d partitions, fewer than the %d of %s: its re-emitted outcomes are flagged only "
                    "below the committed offset", name, counts[name], topics.sample_partitions, self.topics.samples,
                )  # fmt: skip
        return topics

    # -- where to read and write ---------------------------------------------------------------------------
    def resume_from(self, offsets: Mapping[int, int]) -> None:
        """Read each sample partition from ``offsets`` (a restored snapshot's): at the next assignment, and
        now for partitions already owned."""
        self._resume_at = dict(offsets)
        if self.consumer is None or not self.assigned:
            return
        for partition in [p for p in self._resume_at if p in self.assigned]:
            offset = self._resume_at.pop(partition)
            try:
                self.consumer.seek(TopicPartition(self.topics.samples, partition, offset))
            except KafkaException as exc:  # not assigned to this replica (any more)
                log.warning("seek %s[%s] to %s failed: %s", self.topics.samples, partition, offset, exc)

    def outcome_partition(self, topic: str, source_partition: int) -> int | None:
        """The outcome partition aligned with ``source_partition`` (None before the first assignment)."""
        return None if self.outcomes is None else self.outcomes.partition_for(topic, source_partition)

    def outcome_delivered(self, topic: str, partition: int, offset: int, msg: Message | None) -> None:
        """An outcome of sample ``partition``@``offset`` was delivered (``msg`` says where)."""
        at = None if msg is None else msg.offset()
        if at is not None:
            self.positions.delivered(topic, partition, offset, at)

    def label_done(self, partition: int, offset: int) -> None:
        self._label_next[partition] = max(self._label_next.get(partition, 0), offset + 1)

    # -- committing, lag -------------------------------------------------------------------------------------
    def commit(self, *, sync: bool = False) -> None:
        """Commit what changed since the last commit (module docstring); asynchronous unless ``sync``."""
        if self.consumer is None:
            return
        offsets: list[TopicPartition] = []
        outcomes = self.outcomes
        for partition, resume in self.ledger.resume_offsets().items():
            if partition not in self.assigned:
                continue
            offsets.append(TopicPartition(self.topics.samples, partition, resume))
            for topic in outcomes.names if outcomes is not None else ():
                start = self.positions.start_for(topic, partition, resume)
                if start is not None and outcomes is not None and outcomes.aligned(topic):
                    offsets.append(TopicPartition(topic, outcomes.partition_for(topic, partition), start))
        offsets += [TopicPartition(self.topics.labels, p, o) for p, o in self._label_next.items()]
        key = sorted((tp.topic, tp.partition, tp.offset) for tp in offsets)
        if not offsets or key == self._committed:
            return
        try:
            if sync:  # two calls: the client's overloads take a literal ``asynchronous``
                self.consumer.commit(offsets=offsets, asynchronous=False)
            else:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            self._committed = key
        except KafkaException as exc:  # e.g. a rebalance in progress: the next interval tries again
            log.warning("committing offsets failed: %s", exc)

    def measure_lag(self) -> None:
        """Positions and the cached high watermarks of the owned sample partitions (no broker call)."""
        if self.consumer is None or not self.assigned:
            return
        tps = [TopicPartition(self.topics.samples, p) for p in sorted(self.assigned)]
        try:
            for tp in self.consumer.position(tps):
                _low, high = self.consumer.get_watermark_offsets(tp, cached=True)
                self.lag.offsets(tp.partition, tp.offset, high)
        except KafkaException as exc:
            log.debug("lag: %s", exc)
