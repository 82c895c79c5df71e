#!/usr/bin/env bash
# The test suite: set-up, linter, type checker, tests. Works on a fresh machine.
# RECORD_TEST_TIMES=1 also writes pytest's time per group of test files to
# profiling/results/test_times.json (docs/results.md, "Test suite").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] ruff"
.venv/bin/ruff check stragglerkit tests profiling scripts build_backend setup.py
echo "[test] mypy"
.venv/bin/mypy
echo "[test] import-linter"
.venv/bin/lint-imports
echo "[test] pytest"
junit=$(mktemp)
trap 'rm -f "$junit"' EXIT
started=$SECONDS
status=0
.venv/bin/python -m pytest -q --durations=25 --junitxml="$junit" tests "$@" || status=$?
took=$((SECONDS - started))
echo "[test] pytest took $((took / 60)).$((took % 60 * 10 / 60)) min"
if [ "${RECORD_TEST_TIMES:-}" = 1 ]; then
  .venv/bin/python profiling/_test_times.py "$junit" --wall-seconds "$took" \
    --command "RECORD_TEST_TIMES=1 bash scripts/test.sh $*"
fi
exit "$status"
