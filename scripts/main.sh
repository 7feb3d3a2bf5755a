#!/usr/bin/env bash
# The README's main command: set up .venv, then run the main job.
# Until the service lands, the main job profiles a model, prints its plan under a budget, and plans
# again under a tighter budget (see README).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
out="${FERRET_OUT:-out/main}"
mkdir -p "$out"
.venv/bin/ferret profile --model mnistnet --out "$out/mnistnet.profile.json"
.venv/bin/ferret plan --model mnistnet --profile "$out/mnistnet.profile.json"
.venv/bin/ferret plan --model mnistnet --profile "$out/mnistnet.profile.json" --budget 40MiB
