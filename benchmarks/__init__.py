"""Benchmark scripts and their committed results; run each from the root: ``python -m benchmarks.<folder>.<script>``."""
