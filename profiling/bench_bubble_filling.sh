#!/usr/bin/env bash
# OptCC with and without bubble filling on real links: one host at 7/8 (l = 8/7), 8 ranks, 32 MiB
# float32, the runtime's segment count (9), alternating launches (fills as the runtime decides,
# then STRAGGLERKIT_OPTCC_BUBBLE_FILLING=off), RUNS times each (default 3), at each bandwidth given
# (default 1Gbit 250Mbit). MESSAGE_BYTES=131072 sets STRAGGLERKIT_OPTCC_MESSAGE_BYTES (36 segments
# instead of 9) and names the files with _k<segments>. FILLINGS="on off" compares fills forced on
# with none (default "auto off"); OUT sets the folder. Needs root. Writes
#   $OUT/l8_7_<bandwidth>[_k<segments>]_<filling>_run<i>.json   (OUT: profiling/results/bubble_filling)
# and then the summary (python profiling/bubble_filling_summary.py $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-profiling/results/bubble_filling}
RUNS=${RUNS:-3}
if [ $# -gt 0 ]; then BANDWIDTHS=("$@"); else BANDWIDTHS=(1Gbit 250Mbit); fi
mkdir -p "$OUT"
SUFFIX=""
if [ -n "${MESSAGE_BYTES:-}" ]; then
  export STRAGGLERKIT_OPTCC_MESSAGE_BYTES=$MESSAGE_BYTES
  SUFFIX="_k$((33554432 / (7 * MESSAGE_BYTES)))"  # the runtime's segment count for 32 MiB on 8 ranks
fi
for bandwidth in "${BANDWIDTHS[@]}"; do
  for i in $(seq 1 "$RUNS"); do
    for filling in ${FILLINGS:-auto off}; do
      echo "== $bandwidth run $i/$RUNS: bubble filling $filling" >&2
      STRAGGLERKIT_OPTCC_BUBBLE_FILLING=$filling "$PY" -m stragglerkit.cli bench --world-size 8 \
        --bandwidth "$bandwidth" --sizes 32MiB --dtype float32 --iters 7 --warmup 2 --algorithms gloo,optcc \
        --degrade 3:8/7 --json "$OUT/l8_7_${bandwidth}${SUFFIX}_${filling}_run$i.json"
    done
  done
done
"$PY" profiling/bubble_filling_summary.py "$OUT"
