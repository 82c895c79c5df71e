#!/usr/bin/env bash
# OptCC and the balanced ring at l = 8/7 (one host at 7/8) at three link rates, alternating: the
# same plans (32 MiB on 8 ranks, 9 segments) on the same 2 cores, with 1, 1/2 and 1/4 of the CPU
# work per second of transfer. If the excess over the model is the plan's, it stays with the
# rate; if it is the cores', it shrinks with it. Needs root. Writes
# profiling/results/link_rate_l8_7/<rate>_<run>.json, then summary.json (link_rate_summary.py).
# RUNS (default 2) rounds numbered from FIRST_RUN (default 1; a later round adds files instead of
# replacing them); RATES (default "1Gbit 500Mbit 250Mbit"). About 6 minutes a round.
set -euo pipefail
cd "$(dirname "$0")/.."
source profiling/_bench_runs.sh
OUT=profiling/results/link_rate_l8_7
mkdir -p "$OUT"
first=${FIRST_RUN:-1}
for run in $(seq "$first" $((first + ${RUNS:-2} - 1))); do
  for rate in ${RATES:-1Gbit 500Mbit 250Mbit}; do
    bench --bandwidth "$rate" --algorithms gloo,optcc,balanced_ring --degrade 3:8/7 --json "$OUT/${rate}_${run}.json"
  done
done
"$PY" profiling/link_rate_summary.py "$OUT"
