#!/usr/bin/env bash
# Capture an Nsight Systems timeline of any command with stragglerkit's NVTX ranges on
# (STRAGGLERKIT_NVTX=1: one range per all_reduce call and per phase or round of its plan, in the "stragglerkit"
# domain; stragglerkit/report/nvtx.py). Needs nsys on PATH and an NVTX backend (the nvtx package,
# or a CUDA build of torch); exits with 2 and says so if nsys is missing. Writes OUT.nsys-rep
# (default /tmp/stragglerkit; reports are large and stay out of the repository) and prints the
# NVTX range summary. For a multi-rank launcher, wrap the whole launch, e.g.
#   bash profiling/nsys_capture.sh torchrun --nproc-per-node 8 train.py
#   OUT=/tmp/executor bash profiling/nsys_capture.sh .venv/bin/python profiling/bench_executor.py --repeats 10 --out /tmp/e.json
set -euo pipefail
if [ "$#" -eq 0 ]; then
  echo "usage: [OUT=/path/report] bash profiling/nsys_capture.sh COMMAND [ARGS...]" >&2
  exit 64
fi
if ! command -v nsys >/dev/null 2>&1; then
  echo "nsys_capture: nsys (NVIDIA Nsight Systems) is not installed or not on PATH; install it" \
    "(https://developer.nvidia.com/nsight-systems) and run again. Nothing was captured." >&2
  exit 2
fi
OUT=${OUT:-/tmp/stragglerkit}
STRAGGLERKIT_NVTX=1 nsys profile --trace=nvtx,cuda,osrt --sample=none --force-overwrite=true \
  --output "$OUT" "$@"
nsys stats --report nvtx_sum "$OUT.nsys-rep" || true
echo "wrote $OUT.nsys-rep" >&2
