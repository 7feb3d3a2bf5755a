#!/usr/bin/env bash
# Regenerate the committed layer profiles (benchmarks/profiles/README.md says how they were made).
# Run from anywhere; FERRET overrides the command (default: the repository's .venv/bin/ferret).
# One torch thread, CPU, float32, batch 1. With one thread the clock is the thread's CPU time, so other
# processes on the machine do not inflate the numbers much (they still share caches): prefer an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
FERRET=${FERRET:-.venv/bin/ferret}
OUT=benchmarks/profiles
COMMON=(--device cpu --dtype float32 --threads 1 --clock auto --batch-size 1 --num-classes 10 --seed 0)

profile() {  # profile FILE ARGS...
    local file=$1
    shift
    echo "== $file" >&2
    "$FERRET" profile "${COMMON[@]}" "$@" --out "$OUT/$file"
}

profile mlp.json           --model mlp                          --warmup 5 --repeats 50
profile mlp-digits.json    --model mlp --in-features 64         --warmup 5 --repeats 50  # sklearn digits 8x8 (ferret bench, benchmarks/live)
profile mnistnet.json      --model mnistnet                     --warmup 5 --repeats 50
profile convnet.json       --model convnet                      --warmup 5 --repeats 50
profile resnet18-32.json   --model resnet18  --input-size 32    --warmup 5 --repeats 30
profile mobilenet-32.json  --model mobilenet --input-size 32    --warmup 5 --repeats 30
profile resnet18-224.json  --model resnet18  --input-size 224   --warmup 3 --repeats 11
profile mobilenet-224.json --model mobilenet --input-size 224   --warmup 3 --repeats 11
# step times of mini-batches (B-Skip, Camel, replay micro-batches, MIR's candidates): benchmarks/methods/
profile mnistnet-batches.json --model mnistnet --batch-sizes 1,10,20,50 --warmup 5 --repeats 30
profile convnet-batches.json  --model convnet  --batch-sizes 1,10,20,50 --warmup 5 --repeats 30
