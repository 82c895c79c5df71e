#!/usr/bin/env bash
# Training with Horovod on the emulated cluster: stragglerkit.straggler_aware against plain
# hvd.DistributedOptimizer (`python -m profiling.lab.train --framework horovod`), 8 ranks at
# 1 Gbit/s, each rank a Horovod process in its own network namespace, launched as horovodrun
# --gloo launches (the rendezvous server on the switch); the DDP bench's MLP (MODEL, default 32MiB).
# Four scenarios, each launched RUNS times (default 3;
# no fault NO_FAULT_RUNS times, default 5; the summary quotes the median). Every launch trains three
# copies in turns: plain, a second plain copy (the A/A control, whose ratio to the first is the
# launch's noise) and stragglerkit:
#   no fault (150 steps):                             within 1 % of plain Horovod's step
#   rank 7 late by 2x its pre-phase from step 20:     switched by step 40, 1.1x
#   rank 3's NIC at 1/2 from step 20:                 switched by step 50, 1.2x
#   every rank late by uniform[0, 20 ms] from step 20: no switch
# and in every run the parameters equal plain Horovod's within 1e-5, identical on every rank.
# About 18 minutes a run on a 2-core machine.
# Needs root and Horovod (bash scripts/install_horovod.sh). Extra arguments go to every launch.
# Overwrites profiling/results/bench_train_horovod.json (the per-run files live in a scratch folder).
#   bash profiling/bench_train_horovod.sh
#   RUNS=1 MODEL=8MiB bash profiling/bench_train_horovod.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source profiling/_bench_runs.sh
RUNS=${RUNS:-3}
NO_FAULT_RUNS=${NO_FAULT_RUNS:-5}
COMMON=(--framework horovod --world-size 8 --bandwidth 1Gbit --model-size "${MODEL:-32MiB}")
for i in $(seq 1 "$NO_FAULT_RUNS"); do
  echo "== Horovod training run $i/$NO_FAULT_RUNS: no fault" >&2
  train_bench "${COMMON[@]}" --steps 150 "$@" --json "$SCRATCH/no_fault_run$i.json"
done
for i in $(seq 1 "$RUNS"); do
  echo "== Horovod training run $i/$RUNS: straggler" >&2
  train_bench "${COMMON[@]}" --straggler 7 --delay auto --from-step 20 --steps 120 "$@" --json "$SCRATCH/straggler_run$i.json"
  echo "== Horovod training run $i/$RUNS: degraded NIC" >&2
  train_bench "${COMMON[@]}" --degrade 3:2 --from-step 20 --steps 140 "$@" --json "$SCRATCH/degraded_run$i.json"
  echo "== Horovod training run $i/$RUNS: jitter" >&2
  train_bench "${COMMON[@]}" --jitter 20 --from-step 20 --steps 100 "$@" --json "$SCRATCH/jitter_run$i.json"
done
"$PY" profiling/_train_summary.py --framework horovod "$SCRATCH"/*_run*.json \
  --command "RUNS=$RUNS NO_FAULT_RUNS=$NO_FAULT_RUNS MODEL=${MODEL:-32MiB} bash profiling/bench_train_horovod.sh $*"
