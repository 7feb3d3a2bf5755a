"""The trainer service: Kafka samples → validation → prediction on arrival → the planned Ferret pipeline
(wall clock) → Kafka predictions, with offsets, snapshots, control plane and metrics (DESIGN §1, §4)."""
