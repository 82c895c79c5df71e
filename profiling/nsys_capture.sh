#!/usr/bin/env bash
# Capture one rank's Nsight Systems timeline with stragglerkit's ranges, and export it to SQLite
# for `stragglerkit report` (docs/profiling.md has the naming scheme and the launcher recipes).
#
# Wraps ONE rank's command: the launcher starts this script once per rank.
#   torchrun --nproc-per-node 4 --no-python bash profiling/nsys_capture.sh python train.py
#   horovodrun -np 4 bash profiling/nsys_capture.sh python train_hvd.py
#   torchrun --nproc-per-node 4 --no-python bash profiling/nsys_capture.sh \
#       python examples/bert/train.py --steps 60
# The rank comes from RANK (torchrun), OMPI_COMM_WORLD_RANK (Open MPI, horovodrun), HOROVOD_RANK
# (Gloo-based horovodrun), PMI_RANK (MPICH) or LOCAL_RANK, the first one set; each rank writes
# $OUT/rank<r>.nsys-rep and $OUT/rank<r>.sqlite. Without any, the command is one process tree
# (e.g. `stragglerkit bench`, which starts its own ranks) and writes $OUT/run.*.
#
# Settings (environment):
#   OUT        where the reports go (default /tmp/stragglerkit-nsys; they are large)
#   FROM_STEP  the capture starts at the NVTX range "stragglerkit/step FROM_STEP" of the
#              stragglerkit domain (nsys --capture-range=nvtx, --capture-range-end=none: from there
#              to the end of the run); default 0; "none" captures the whole run (the collective
#              bench, which has no steps)
# Traces nvtx,cuda,osrt; STRAGGLERKIT_NVTX=1 forces stragglerkit's ranges on. Exits 2 and says so
# when nsys is missing, 64 on a usage error, 1 when OUT cannot be made, else with the command's status.
set -uo pipefail

usage() {
  echo "usage: [OUT=DIR] [FROM_STEP=N|none] bash profiling/nsys_capture.sh COMMAND [ARGS...]" >&2
  exit 64
}
[ "$#" -gt 0 ] || usage
if ! command -v nsys >/dev/null 2>&1; then
  echo "nsys_capture: nsys (NVIDIA Nsight Systems) is not installed or not on PATH; install it" \
    "(https://developer.nvidia.com/nsight-systems) and run again. Nothing was captured." >&2
  exit 2
fi

OUT=${OUT:-/tmp/stragglerkit-nsys}
FROM_STEP=${FROM_STEP:-0}
rank=${RANK:-${OMPI_COMM_WORLD_RANK:-${HOROVOD_RANK:-${PMI_RANK:-${LOCAL_RANK:-}}}}}
if [ -n "$rank" ] && ! [[ "$rank" =~ ^[0-9]+$ ]]; then
  echo "nsys_capture: the rank variable holds '$rank', not a rank number" >&2
  exit 64
fi
name=${rank:+rank$rank}
name=${name:-run}

capture=()
if [ "$FROM_STEP" != "none" ]; then
  if ! [[ "$FROM_STEP" =~ ^[0-9]+$ ]]; then
    echo "nsys_capture: FROM_STEP must be a step number or 'none', got '$FROM_STEP'" >&2
    exit 64
  fi
  # NSYS_NVTX_PROFILER_REGISTER_ONLY=0: the range may carry a plain string (torch.cuda.nvtx's),
  # not only a registered one (the nvtx package's)
  capture=(--capture-range=nvtx "--nvtx-capture=stragglerkit/step $FROM_STEP@stragglerkit" --capture-range-end=none)
  export NSYS_NVTX_PROFILER_REGISTER_ONLY=0
fi

if ! mkdir -p "$OUT"; then
  echo "nsys_capture: cannot create the report folder OUT=$OUT; set OUT to a writable folder" >&2
  exit 1
fi
report="$OUT/$name"
export STRAGGLERKIT_NVTX=1
status=0
nsys profile --trace=nvtx,cuda,osrt --sample=none --force-overwrite=true "${capture[@]}" \
  --output "$report" "$@" || status=$?
if [ -f "$report.nsys-rep" ]; then
  nsys export --type sqlite --force-overwrite=true --output "$report.sqlite" "$report.nsys-rep" >&2 ||
    echo "nsys_capture: exporting $report.nsys-rep to SQLite failed" >&2
  echo "nsys_capture: wrote $report.nsys-rep and $report.sqlite (then: stragglerkit report $OUT)" >&2
else
  echo "nsys_capture: no report at $report.nsys-rep (did the run reach stragglerkit/step $FROM_STEP?)" >&2
fi
exit "$status"
