"""The producer (``ferret produce``): streams a dataset into ``<prefix>.samples`` at a paced rate.

Modules: ``stream`` (:class:`SampleProducer`: pacing, records, labels, delivery counts), ``ready`` (the
wait for an idempotent client's producer id before the stream's clock starts), ``rate`` (the declared
rate headers ``ferret.rate`` / ``ferret.partitions`` the producer stamps and the trainer reads).
"""

from services.producer.rate import declared_interval, rate_headers
from services.producer.ready import ProducerReadiness
from services.producer.stream import ProduceReport, ProducerError, SampleProducer

__all__ = [
    "ProduceReport",
    "ProducerError",
    "ProducerReadiness",
    "SampleProducer",
    "declared_interval",
    "rate_headers",
]
