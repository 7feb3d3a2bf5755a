"""Adapters around ferret_core: CLI, Kafka producer/trainer, gRPC control plane, Redis snapshots."""
