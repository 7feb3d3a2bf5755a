"""Benchmarks of the planner: its speed, and its plans against an exhaustive search."""
