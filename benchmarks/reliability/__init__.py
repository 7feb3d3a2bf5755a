"""Reliability benchmarks: recovery after the trainer is killed."""
