"""Benchmarks of the settings loader: ours beside a pydantic-settings prototype."""
