#!/usr/bin/env bash
# Training on the emulated cluster: stragglerkit's DDP hook against plain DDP (`python -m
# profiling.lab.train`), 8 ranks at 1 Gbit/s, a 32 MiB model (MODEL=8MiB for the small one), in three
# scenarios, each launched RUNS times (default 3;
# no fault NO_FAULT_RUNS times, default 5; the summary quotes the median). Every launch trains three
# copies in turns: plain, a second plain copy (the A/A control, whose ratio to the first is the
# launch's noise) and stragglerkit:
#   no fault (200 steps):                           the hook costs at most 1 % of a step
#   rank 7 late by 2x its pre-phase from step 20:   1.1x plain DDP's steady step
#   rank 3's NIC at 1/2 from step 20:               1.2x
# Needs root. About 20 minutes a run on a 2-core machine. Extra arguments go to every launch.
# Overwrites profiling/results/bench_train.json (the per-run files live in a scratch folder).
#   bash profiling/bench_train.sh
#   RUNS=1 bash profiling/bench_train.sh --steps-per-block 1
set -euo pipefail
cd "$(dirname "$0")/.."
source profiling/_bench_runs.sh
RUNS=${RUNS:-3}
NO_FAULT_RUNS=${NO_FAULT_RUNS:-5}
COMMON=(--world-size 8 --bandwidth 1Gbit --model-size "${MODEL:-32MiB}")
for i in $(seq 1 "$NO_FAULT_RUNS"); do
  echo "== training run $i/$NO_FAULT_RUNS: no fault" >&2
  train_bench "${COMMON[@]}" --steps 200 "$@" --json "$SCRATCH/no_fault_run$i.json"
done
for i in $(seq 1 "$RUNS"); do
  echo "== training run $i/$RUNS: straggler" >&2
  train_bench "${COMMON[@]}" --straggler 7 --delay auto --from-step 20 --steps 120 "$@" --json "$SCRATCH/straggler_run$i.json"
  echo "== training run $i/$RUNS: degraded NIC" >&2
  train_bench "${COMMON[@]}" --degrade 3:2 --from-step 20 --steps 160 "$@" --json "$SCRATCH/degraded_run$i.json"
done
"$PY" profiling/_train_summary.py "$SCRATCH"/*_run*.json \
  --command "RUNS=$RUNS NO_FAULT_RUNS=$NO_FAULT_RUNS MODEL=${MODEL:-32MiB} bash profiling/bench_train.sh $*"
