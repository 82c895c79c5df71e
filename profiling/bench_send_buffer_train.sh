#!/usr/bin/env bash
# How big stragglerkit's own TCP send buffer should be (STRAGGLERKIT_TCP_SEND_BUFFER): the training
# bench with a persistent straggler (8 ranks, 1 Gbit/s, 8 MiB model, straggler 7 from step 20,
# 120 steps), alternating the kernel's buffers (off), 256 KiB and 1 MiB, RUNS times each (default
# 2); then the AllReduce bench's straggler scenario (32 MiB, median of 7) with 1 MiB, RUNS times.
# A training step's compute competes with the senders for the cores, so a small buffer, which
# needs its sender woken more often, can cost there what it gains in the AllReduce alone
# (runtime/send_buffer.py). Needs root. Writes profiling/results/send_buffer/
# train_straggler_<off|256kib|1mib>_run<i>.json and straggler_runtime1mib_run<i>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=profiling/results/send_buffer
RUNS=${RUNS:-2}
mkdir -p "$OUT"
for i in $(seq 1 "$RUNS"); do
  for value in off 256KiB 1MiB; do
    label=$(echo "$value" | tr '[:upper:]' '[:lower:]')
    echo "== run $i/$RUNS: training with a straggler, send buffer $value" >&2
    STRAGGLERKIT_TCP_SEND_BUFFER=$value "$PY" -m stragglerkit.cli bench --mode train --world-size 8 \
      --bandwidth 1Gbit --straggler 7 --delay auto --from-step 20 --steps 120 \
      --json "$OUT/train_straggler_${label}_run$i.json"
  done
done
for i in $(seq 1 "$RUNS"); do
  echo "== run $i/$RUNS: AllReduce with a straggler, send buffer 1MiB" >&2
  STRAGGLERKIT_TCP_SEND_BUFFER=1MiB "$PY" -m stragglerkit.cli bench --world-size 8 --bandwidth 1Gbit \
    --sizes 32MiB --dtype float32 --iters 7 --warmup 2 --algorithms gloo,stragglar --straggler 7 --delay auto \
    --json "$OUT/straggler_runtime1mib_run$i.json"
done
