#!/usr/bin/env bash
# Selective reduce on real ranks: `python -m profiling.lab.train --sync selective` on 8 emulated
# hosts whose NICs run at u x 1 Gbit/s (u ~ U[0.05, 1]), compute times from the transformer
# stand-in. Selective reduce, partial reduce and all-reduce train the same model for DURATION
# seconds each (default 60). Run RUNS times (default 3), each with its own NIC draw (--seed i).
# The summary quotes the median. Needs root and iproute2, and a quiet machine: the testbed checks
# its shaped links and refuses busy ones.
# Overwrites profiling/results/train_selective.json; extra arguments go to every launch.
#   bash profiling/bench_train_selective.sh
#   RUNS=1 DURATION=20 bash profiling/bench_train_selective.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUNS=${RUNS:-3}
DURATION=${DURATION:-60}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/stragglerkit-selective.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
for i in $(seq 0 $((RUNS - 1))); do
  echo "== run $((i + 1))/$RUNS (seed $i)" >&2
  launch=("$PY" -m profiling.lab.train --sync selective --world-size 8 --bandwidth 1Gbit
    --duration "$DURATION" --seed "$i" --json "$SCRATCH/run$i.json" "$@")
  "${launch[@]}" || "${launch[@]}"  # a second try: the shaping check refuses a busy machine's links
done
"$PY" profiling/_selective_train_summary.py "$SCRATCH"/run*.json \
  --command "RUNS=$RUNS DURATION=$DURATION bash profiling/bench_train_selective.sh $*"
