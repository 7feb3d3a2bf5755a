"""The trainer service: Kafka samples → validation → prediction on arrival → the planned pipeline (wall
clock) → Kafka predictions, with offsets, snapshots, control plane and metrics (DESIGN §1, §4). The
record's path is :mod:`services.trainer.stream`; ``docs/service.md`` maps every module."""
