#!/usr/bin/env bash
# The acceptance figures on the emulated cluster: 8 ranks, 1 Gbit/s per host, 32 MiB of float32,
# median of 7 iterations, the four scenarios below run RUNS times (default 3) in turn. Needs root
# (network namespaces). About 4 minutes a run on a 2-core machine.
#   no fault:                 our ring vs gloo (within 5 %)
#   straggler (delay auto):   StragglAR vs gloo from the straggler's arrival (1.25x) and the first (1.15x)
#   one host at 1/2 (l = 2):  OptCC vs gloo (1.5x) and over the lower bound l*S/B (15 %)
#   one host at 7/8 (l = 8/7): the balanced ring and OptCC over gloo on the fault-free cluster (8 %)
# LINK_RATES="1Gbit 500Mbit 250Mbit" also runs the l = 8/7 scenario RUNS times at each of those
# rates (about 2 minutes a launch). Overwrites profiling/results/bench_acceptance.json (the
# per-run files live in a scratch folder that is removed).
#   bash profiling/bench_acceptance.sh
#   RUNS=1 bash profiling/bench_acceptance.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source profiling/_bench_runs.sh
RUNS=${RUNS:-3}
COMMON=(--world-size 8 --bandwidth 1Gbit --sizes 32MiB --dtype float32 --iters 7 --warmup 2)
dirs=()
for i in $(seq 1 "$RUNS"); do
  out="$SCRATCH/run$i"
  mkdir -p "$out"
  echo "== acceptance run $i/$RUNS" >&2
  bench "${COMMON[@]}" --algorithms gloo,ring --json "$out/bench_no_fault.json"
  bench "${COMMON[@]}" --algorithms gloo,ring,stragglar --straggler 7 --delay auto --json "$out/bench_straggler.json"
  bench "${COMMON[@]}" --algorithms gloo,optcc --degrade 3:2 --json "$out/bench_degraded_l2.json"
  bench "${COMMON[@]}" --algorithms gloo,optcc,balanced_ring --degrade 3:8/7 --json "$out/bench_degraded_l8_7.json"
  dirs+=("$out")
done
rates=()
if [ -n "${LINK_RATES:-}" ]; then
  mkdir -p "$SCRATCH/rates"
  for i in $(seq 1 "$RUNS"); do
    for rate in $LINK_RATES; do
      echo "== l = 8/7 at $rate, launch $i/$RUNS" >&2
      bench "${COMMON[@]}" --bandwidth "$rate" --algorithms gloo,optcc,balanced_ring --degrade 3:8/7 \
        --json "$SCRATCH/rates/${rate}_$i.json"
    done
  done
  rates=(--link-rates "$SCRATCH/rates")
fi
"$PY" profiling/_acceptance_summary.py --runs "${dirs[@]}" "${rates[@]}" \
  --command "RUNS=$RUNS LINK_RATES='${LINK_RATES:-}' bash profiling/bench_acceptance.sh"
