"""Benchmarks of the pipeline schedules: accuracy through ferret simulate, and memory."""
