"""Benchmarks of the engine on the virtual and the wall clock: overheads, service times, memory models, staleness."""
