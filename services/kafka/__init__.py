"""Kafka adapters of the services: topic set-up and counting (producer and consumer loops come later)."""

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
