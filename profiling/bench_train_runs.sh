#!/usr/bin/env bash
# bench --mode train in its three scenarios, with the 8 MiB model and (straggler, degraded NIC) the
# 32 MiB one, each launched RUNS times (default 3; this machine's run-to-run spread is a few %, so
# the README quotes the median of the runs). 8 ranks on the emulated cluster at 1 Gbit/s; needs
# root. Extra arguments go to every run, e.g.
#   bash profiling/bench_train_runs.sh free                                  (the defaults)
#   bash profiling/bench_train_runs.sh lockstep --steps-per-block 1          (a barrier before every step)
#   bash profiling/bench_train_runs.sh copied --no-gradient-as-bucket-view
# writes profiling/results/train_{no_fault,straggler,degraded}[_32mib]_<LABEL>_run<i>.json
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
LABEL=${1:?usage: bench_train_runs.sh LABEL [extra bench options]}
shift
RUNS=${RUNS:-3}
OUT=profiling/results
COMMON=(--mode train --world-size 8 --bandwidth 1Gbit)
for i in $(seq 1 "$RUNS"); do
  echo "== run $i/$RUNS: no fault" >&2
  "$PY" -m stragglerkit.cli bench "${COMMON[@]}" --steps 200 "$@" --json "$OUT/train_no_fault_${LABEL}_run$i.json"
  echo "== run $i/$RUNS: straggler" >&2
  "$PY" -m stragglerkit.cli bench "${COMMON[@]}" --straggler 7 --delay auto --from-step 20 --steps 120 "$@" \
    --json "$OUT/train_straggler_${LABEL}_run$i.json"
  echo "== run $i/$RUNS: degraded NIC" >&2
  "$PY" -m stragglerkit.cli bench "${COMMON[@]}" --degrade 3:2 --from-step 20 --steps 160 "$@" \
    --json "$OUT/train_degraded_${LABEL}_run$i.json"
  echo "== run $i/$RUNS: straggler, 32 MiB model" >&2
  "$PY" -m stragglerkit.cli bench "${COMMON[@]}" --straggler 7 --delay auto --from-step 20 --steps 120 \
    --model-size 32MiB "$@" --json "$OUT/train_straggler_32mib_${LABEL}_run$i.json"
  echo "== run $i/$RUNS: degraded NIC, 32 MiB model" >&2
  "$PY" -m stragglerkit.cli bench "${COMMON[@]}" --degrade 3:2 --from-step 20 --steps 160 --model-size 32MiB "$@" \
    --json "$OUT/train_degraded_32mib_${LABEL}_run$i.json"
done
