"""Benchmarks of the services on a local Kafka: latency, overhead, saturation and the broker's effects."""
