#!/usr/bin/env bash
# The cost models measured: `stragglerkit bench --mode calibrate` runs every algorithm on the
# emulated cluster (250 Mbit/s, 1 Gbit/s, 2 Gbit/s) and loopback, 4/6/8 ranks, 4 KiB..64 MiB, with
# no fault, a straggler and a NIC at 1/2, then fits alpha-beta, alpha-beta-gamma and GenModel on
# two thirds of the samples and reports their errors on the rest (docs/bench.md, "--mode
# calibrate"). 45-90 min; needs root and iproute2, and a quiet machine.
# Overwrites profiling/results/calibration.json and keeps its raw samples, compressed, beside it
# (profiling/results/calibration_samples.json.gz), so that the fit can be re-derived:
#   gunzip -k profiling/results/calibration_samples.json.gz
#   stragglerkit bench --mode calibrate --from-samples --samples profiling/results/calibration_samples.json
# Extra arguments go to the bench (e.g. a smaller grid: --world-sizes 4 --bandwidths 1Gbit).
#   bash profiling/bench_calibrate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source profiling/_bench_runs.sh
samples=profiling/results/calibration_samples.json
"$PY" -m stragglerkit.cli bench --mode calibrate --samples "$samples" --json "$SCRATCH/comparison.json" "$@"
"$PY" profiling/_calibrate_summary.py "$SCRATCH/comparison.json" --command "bash profiling/bench_calibrate.sh $*"
gzip -9 -f "$samples"
echo "kept the samples: $samples.gz ($(du -k "$samples.gz" | cut -f1) KiB)"
