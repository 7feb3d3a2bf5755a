#!/usr/bin/env bash
# The README's test command: set up .venv, lint, type-check the core, run every test tier.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
echo "== ruff" >&2
.venv/bin/ruff check .
echo "== mypy (strict on ferret_core)" >&2
.venv/bin/mypy ferret_core
echo "== pytest" >&2
.venv/bin/python -m pytest "$@"
