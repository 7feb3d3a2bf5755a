#!/usr/bin/env bash
# The README's main command: set up .venv, then run the demo on the embedded local stack (DESIGN §6):
# a Kafka-protocol broker and a Redis server as child processes, `ferret produce` → `ferret run` (the
# planned Ferret pipeline) → predictions, one budget change over gRPC mid-stream, a snapshot, and a
# report in out/demo-<time>/ (summary.json, report.md, online_accuracy.png). Extra arguments go to
# `ferret demo` (e.g. --items 1000 --out out/demo).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/ferret demo "$@"
