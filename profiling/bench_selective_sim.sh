#!/usr/bin/env bash
# The selective-reduce paper's experiment, simulated (`stragglerkit simulate --selective`,
# docs/selective.md): selective reduce, partial reduce and all-reduce on n = 40..200 workers, both
# compute-time stand-ins (resnet50, transformer), TRIALS trials (default 20) of 100 s each; then two
# sensitivity runs of SENS_TRIALS trials (default 5): compute times x10, and Eq. (4) as the
# conditional probability. One core; about 10 minutes on a 2-core machine. Extra arguments go to
# every run. Overwrites profiling/results/selective_sim.json and prints the tables of docs/results.md.
#   bash profiling/bench_selective_sim.sh
#   TRIALS=3 SENS_TRIALS=2 bash profiling/bench_selective_sim.sh --world-sizes 40,80
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/stragglerkit-bench.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
TRIALS=${TRIALS:-20}
SENS_TRIALS=${SENS_TRIALS:-5}
sim() {
  "$PY" -m stragglerkit.cli simulate --selective "$@"
}
echo "== paper setting, $TRIALS trials" >&2
sim --trials "$TRIALS" "$@" --json "$SCRATCH/paper.json" >/dev/null
echo "== sensitivity: compute times x10, $SENS_TRIALS trials" >&2
sim --trials "$SENS_TRIALS" --compute-scale 10 "$@" --json "$SCRATCH/compute_x10.json" >/dev/null
echo "== sensitivity: conditional Eq. (4), $SENS_TRIALS trials" >&2
sim --trials "$SENS_TRIALS" --progress conditional "$@" --json "$SCRATCH/conditional.json" >/dev/null
"$PY" profiling/_selective_summary.py paper="$SCRATCH/paper.json" compute_x10="$SCRATCH/compute_x10.json" \
  conditional="$SCRATCH/conditional.json" \
  --command "TRIALS=$TRIALS SENS_TRIALS=$SENS_TRIALS bash profiling/bench_selective_sim.sh $*"
