#!/usr/bin/env bash
# Oracle vs Ferret M+ (no budget, Iter-Fisher) over longer streams than the `standard` preset's 250 items:
# does Ferret M+'s gap to Oracle close as the stream grows (benchmarks/paper/README.md, § Goals)?
# Same settings as `ferret bench overall --preset standard` (lr 0.02, 300 test items, the committed
# MNISTNet mini-batch profile); writes one JSON per run into results/long_stream/.
#   /work/tools/heavy bash benchmarks/paper/long_stream.sh            # 3000 items, seeds 0 1
#   ITEMS=10000 SEEDS=0 /work/tools/heavy bash benchmarks/paper/long_stream.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
items=${ITEMS:-3000}
out=benchmarks/paper/results/long_stream
mkdir -p "$out"
for dataset in mnist split-mnist; do
  for seed in ${SEEDS:-0 1}; do
    for method in oracle ferret; do
      extra=()
      [ "$method" = ferret ] && extra=(--compensator iter-fisher)
      .venv/bin/ferret simulate --dataset "$dataset" --profile benchmarks/profiles/mnistnet-batches.json \
        --method "$method" --items "$items" --test-items 300 --lr 0.02 --seed "$seed" \
        --cache-dir out/cache "${extra[@]}" --json > "$out/$dataset-$method-$seed-$items.json" 2>/dev/null
    done
  done
done
