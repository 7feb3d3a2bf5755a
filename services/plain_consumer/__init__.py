"""The plain consumer: the loop a user would write instead of Ferret (poll, predict, publish, one SGD step per
item, skip while busy), run live on a Kafka stream beside Ferret's results (``ferret demo``,
``benchmarks/live/``). See :mod:`services.plain_consumer.consumer`."""

from services.plain_consumer.consumer import MAX_AGE_MS, PlainLoop, consume, trainer_settings

__all__ = ["MAX_AGE_MS", "PlainLoop", "consume", "trainer_settings"]
