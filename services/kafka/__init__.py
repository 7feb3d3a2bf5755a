"""Kafka adapters of the services: topic set-up and counting, and the record formats (``record_codec``:
the ``Sample`` codec and dead letters; ``content_type``: the header naming a record's message;
``rate_headers``: the declared stream rate a producer stamps and a trainer plans for)."""

from services.kafka.admin import (
    KafkaSetupError,
    TopicCount,
    TopicNames,
    count_distinct,
    ensure_topics,
    topic_partitions,
)

__all__ = [
    "KafkaSetupError",
    "TopicCount",
    "TopicNames",
    "count_distinct",
    "ensure_topics",
    "topic_partitions",
]
