#!/usr/bin/env bash
# The bench acceptance scenarios with links at 250 Mbit/s instead of 1 Gbit/s: same 8 ranks on the
# same cores, 4x less CPU work per second of transfer. Separates what the algorithms do from what
# a CPU-starved host costs (docs/bench.md, "The same figures with 4x slower links"). Needs root.
# Writes profiling/results/bench_250mbit_*.json (about 20 minutes on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=profiling/results
COMMON=(--world-size 8 --bandwidth 250Mbit --sizes 32MiB --dtype float32 --iters 7 --warmup 2)
"$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,stragglar --straggler 7 --delay auto \
  --json "$OUT/bench_250mbit_straggler.json"
"$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,optcc --degrade 3:2 \
  --json "$OUT/bench_250mbit_degraded_l2.json"
"$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,optcc,ring,balanced_ring --degrade 3:8/7 \
  --json "$OUT/bench_250mbit_degraded_l8_7.json"
# 36 segments instead of the 9 that 512 KiB messages give for 32 MiB on 8 ranks
STRAGGLERKIT_OPTCC_MESSAGE_BYTES=131072 "$PY" -m stragglerkit.cli bench "${COMMON[@]}" --algorithms gloo,optcc \
  --degrade 3:8/7 --json "$OUT/bench_250mbit_degraded_l8_7_k36.json"
# the acceptance summary, now with each figure's 250 Mbit/s counterpart (needs bench_acceptance.sh's files)
if [ -f "$OUT/bench_straggler.json" ]; then "$PY" profiling/bench_acceptance_summary.py "$OUT"; fi
