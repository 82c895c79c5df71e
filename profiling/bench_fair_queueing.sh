#!/usr/bin/env bash
# The acceptance scenarios on links with one FIFO per direction (--no-fair-queueing) and with one
# queue per peer served in turn (--fair-queueing; docs/testbed.md), run alternately RUNS times
# (default 3): 8 ranks on the emulated cluster at 1 Gbit/s, 32 MiB float32, median of 7
# iterations. Two transfers that share a link split it by how much each has queued behind one
# FIFO, and evenly (the simulator's max-min share) behind per-peer queues. Needs root. Writes
# profiling/results/fair_queueing/<scenario>_<fifo|fair>_run<i>.json, then the summary
# (python profiling/send_buffer_summary.py, which reads any such folder).
#   SCENARIOS="degraded_l8_7 degraded_l2" RUNS=3 bash profiling/bench_fair_queueing.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-profiling/results/fair_queueing}
RUNS=${RUNS:-3}
read -r -a NAMES <<< "${SCENARIOS:-straggler degraded_l2 degraded_l8_7}"
mkdir -p "$OUT"
source profiling/_bench_runs.sh  # COMMON and bench()
declare -A SCENARIO=(
  [straggler]="--algorithms gloo,ring,stragglar --straggler 7 --delay auto"
  [degraded_l2]="--algorithms gloo,optcc --degrade 3:2"
  [degraded_l8_7]="--algorithms gloo,optcc,balanced_ring --degrade 3:8/7"
)
for i in $(seq 1 "$RUNS"); do
  for name in "${NAMES[@]}"; do
    read -r -a options <<< "${SCENARIO[$name]}"
    for queues in fifo fair; do
      flag=--fair-queueing
      [ "$queues" = fifo ] && flag=--no-fair-queueing
      echo "== run $i/$RUNS: $name, $queues" >&2
      bench "${options[@]}" "$flag" --json "$OUT/${name}_${queues}_run$i.json"
    done
  done
done
"$PY" profiling/send_buffer_summary.py "$OUT"
