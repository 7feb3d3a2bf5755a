"""Live benchmarks on a local Kafka: the trainer beside a plain loop, and the probes of its stalls and admission."""
