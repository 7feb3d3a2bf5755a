"""Process and distributed executors: throughput, start-up and failure measurements."""
