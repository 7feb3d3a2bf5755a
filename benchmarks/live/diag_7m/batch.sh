#!/bin/bash
# usage: batch.sh NAME [extra side_by_side args...]
name=$1; shift
mkdir -p /tmp/7m/$name
cd "$(dirname "$0")/../../.."
uptime
.venv/bin/python -m benchmarks.live.diag_7m.thread_sampler /tmp/7m/$name/proc.json & sp=$!
FERRET_TRACE_RECORD_PATH=/tmp/7m/$name/t-{pid}.jsonl .venv/bin/python -m benchmarks.live.side_by_side --dataset digits --model mlp --out diag-7m-$name "$@"
rc=$?
kill -TERM $sp; wait $sp
uptime
echo rc=$rc
