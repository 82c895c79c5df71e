#!/usr/bin/env bash
# With nothing wrong, does stragglerkit cost the step anything? The training bench's MLP on the
# emulated cluster (8 ranks at 1 Gbit/s, `python -m profiling.lab.train`), nothing injected, three
# copies taking turns in every launch: the plain framework, a second plain copy (the A/A control)
# and the framework with stragglerkit at its defaults. Per framework (FRAMEWORKS, default
# "ddp horovod megatron") and gradient size (SIZES, default "8MiB 32MiB"), NO_HARM_RUNS launches
# (default 5) of STEPS steps (default 120: two full cycles of the copies' six orders). Target: the
# median plain/stragglerkit step ratio at least 0.99x, no launch switching, the warm-up steps within
# 1 % of the steady state; the results page calls a cell noise where a launch's control is further
# than 1 % from parity.
# Needs root (scripts/setup.sh installs Horovod and megatron-core). Extra arguments go to every launch.
# The launch files live in a scratch folder; KEEP=DIR keeps them there instead, and the summary
# then reads every launch in DIR; a launch with the same KEEP skips the launches already there, so
# an interrupted matrix resumes. Writes profiling/results/bench_no_harm.json: the cells it
# measured, each with its launches' commands, commits and dates; the file's other cells are kept.
#   bash profiling/bench_no_harm.sh
#   KEEP=/var/tmp/no-harm NO_HARM_RUNS=5 FRAMEWORKS=ddp SIZES=8MiB bash profiling/bench_no_harm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source profiling/_bench_runs.sh
NO_HARM_RUNS=${NO_HARM_RUNS:-5}
STEPS=${STEPS:-120}
FRAMEWORKS=${FRAMEWORKS:-ddp horovod megatron}
SIZES=${SIZES:-8MiB 32MiB}
measured=()
for i in $(seq 1 "$NO_HARM_RUNS"); do
  for framework in $FRAMEWORKS; do
    for size in $SIZES; do
      out="$SCRATCH/${framework}_${size}_run$i.json"
      measured+=("$out")
      if [ -f "$out" ]; then
        echo "== no harm $i/$NO_HARM_RUNS: $framework, $size: done already in $out" >&2
        continue
      fi
      echo "== no harm $i/$NO_HARM_RUNS: $framework, $size" >&2
      train_bench --framework "$framework" --world-size 8 --bandwidth 1Gbit --model-size "$size" \
        --steps "$STEPS" "$@" --json "$out"
    done
  done
done
"$PY" profiling/_no_harm_summary.py "${measured[@]}" \
  --command "NO_HARM_RUNS=$NO_HARM_RUNS STEPS=$STEPS FRAMEWORKS='$FRAMEWORKS' SIZES='$SIZES' bash profiling/bench_no_harm.sh $*"
