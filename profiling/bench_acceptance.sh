#!/usr/bin/env bash
# The bench acceptance figures: 8 ranks on the emulated cluster at 1 Gbit/s per host, 32 MiB of
# float32, median of 7 iterations. Needs root (network namespaces). Writes one JSON per scenario
# under profiling/results/ and then the summary (profiling/results/bench_acceptance.json):
#   straggler (delay auto): StragglAR vs gloo from the straggler's and from the first arrival
#   one host at 1/2 (l = 2): OptCC vs gloo, and vs the lower bound l*S/B
#   one host at 7/8 (l = 8/7): OptCC and the balanced ring vs gloo on the fault-free cluster
#   no fault: our ring vs gloo
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=profiling/results
COMMON=(--world-size 8 --bandwidth 1Gbit --sizes 32MiB --dtype float32 --iters 7 --warmup 2)
"$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,ring --json "$OUT/bench_no_fault.json"
"$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,ring,stragglar --straggler 7 --delay auto \
  --json "$OUT/bench_straggler.json"
"$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,optcc --degrade 3:2 --json "$OUT/bench_degraded_l2.json"
"$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,optcc,balanced_ring --degrade 3:8/7 \
  --json "$OUT/bench_degraded_l8_7.json"
"$PY" profiling/bench_acceptance_summary.py "$OUT"
