"""The producer (``ferret produce``): streams a dataset into ``<prefix>.samples`` at a paced rate.

Modules: ``stream`` (:class:`SampleProducer`: pacing, records, labels, delivery counts), ``ready`` (the
wait for an idempotent client's producer id before the stream's clock starts). The declared rate headers
it stamps (``ferret.rate`` / ``ferret.partitions``), which the trainer reads, are a record format:
:mod:`services.kafka.rate_headers`.
"""

from services.producer.ready import ProducerReadiness
from services.producer.stream import ProduceReport, ProducerError, SampleProducer

__all__ = [
    "ProduceReport",
    "ProducerError",
    "ProducerReadiness",
    "SampleProducer",
]
