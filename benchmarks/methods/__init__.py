"""Benchmarks of the methods and OCL algorithms on a class-incremental stream: accuracy and memory."""
