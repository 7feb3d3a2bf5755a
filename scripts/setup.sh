#!/usr/bin/env bash
# Create or refresh the project's virtual environment in .venv (pip only: DESIGN §5).
# Re-installs only when pyproject.toml changed since the last successful install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "setup: Python >= 3.11 is required (found $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$python" -m venv .venv
fi
stamp=.venv/.ferret-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/python -c 'import ferret_core, services' 2>/dev/null; then
  echo "setup: installing the project and its dependencies into .venv (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  # The distribution was called "ferret" before it took its index name "ferret-ocl": drop the old one.
  if .venv/bin/python -m pip show --quiet ferret >/dev/null 2>&1; then
    .venv/bin/python -m pip uninstall --quiet --disable-pip-version-check --yes ferret
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
  echo "$want" > "$stamp"
fi
