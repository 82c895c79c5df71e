#!/usr/bin/env bash
# The acceptance scenarios with the kernel's TCP send buffer (4 MiB at most;
# STRAGGLERKIT_TCP_SEND_BUFFER=off, files *_default_*, named when that was the runtime's default),
# with 256 KiB for every socket of every emulated host (--tcp-send-buffer, the runtime's own bound
# off), and with 256 KiB on stragglerkit's own connections only (STRAGGLERKIT_TCP_SEND_BUFFER=256KiB;
# gloo's all_reduce keeps the kernel's), run
# alternately RUNS times (default 3): 8 ranks on the emulated cluster at 1 Gbit/s, 32 MiB float32,
# median of 7 iterations. A send completes once its data is in the socket buffer; with a large
# buffer a rank's next message starts while its previous one is still on the link, and the two
# share it (the critical path's ``shared_with``; docs/bench.md). Needs root. Writes
# profiling/results/send_buffer/<scenario>_<buffer>_run<i>.json, then the summary
# (python profiling/send_buffer_summary.py).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=profiling/results/send_buffer
RUNS=${RUNS:-3}
mkdir -p "$OUT"
source profiling/_bench_runs.sh  # COMMON and bench()
declare -A SCENARIO=(
  [straggler]="--algorithms gloo,stragglar --straggler 7 --delay auto"
  [degraded_l2]="--algorithms gloo,optcc --degrade 3:2 --no-fault-free-baseline"
  [degraded_l8_7]="--algorithms gloo,optcc --degrade 3:8/7"
)
for i in $(seq 1 "$RUNS"); do
  for name in straggler degraded_l2 degraded_l8_7; do
    read -r -a options <<< "${SCENARIO[$name]}"
    echo "== run $i/$RUNS: $name, the kernel's send buffer" >&2
    STRAGGLERKIT_TCP_SEND_BUFFER=off bench "${options[@]}" --json "$OUT/${name}_default_run$i.json"
    echo "== run $i/$RUNS: $name, 256 KiB send buffer (every host's sysctl)" >&2
    STRAGGLERKIT_TCP_SEND_BUFFER=off bench "${options[@]}" --tcp-send-buffer 256KiB --json "$OUT/${name}_256kib_run$i.json"
    echo "== run $i/$RUNS: $name, 256 KiB send buffer on stragglerkit's own connections" >&2
    STRAGGLERKIT_TCP_SEND_BUFFER=256KiB bench "${options[@]}" --json "$OUT/${name}_runtime256kib_run$i.json"
  done
done
"$PY" profiling/send_buffer_summary.py "$OUT"
