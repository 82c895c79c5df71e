#!/usr/bin/env bash
# The test suite: set-up, linter, type checker, tests. Works on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff"
.venv/bin/ruff check stragglerkit tests profiling scripts build_backend setup.py
echo "[test] mypy"
.venv/bin/mypy
echo "[test] pytest"
started=$SECONDS
status=0
.venv/bin/python -m pytest -q tests "$@" || status=$?
took=$((SECONDS - started))
echo "[test] pytest took $((took / 60)).$((took % 60 * 10 / 60)) min"
exit "$status"
