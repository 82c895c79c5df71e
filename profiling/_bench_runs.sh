# Sourced by the bench_acceptance.sh, bench_train*.sh, bench_finetune.sh and bench_no_harm.sh drivers (all run
# from the repository root): the Python to run, a scratch folder for the per-run files (removed on exit; only the
# summary stays), and one run of `stragglerkit bench` (bench) or of the training bench
# (train_bench: python -m profiling.lab.train) that is tried a second time if the first fails
# (the shaping check refuses a run when a busy machine measures a link under its rate).
# KEEP=DIR keeps the per-run files in DIR instead (a driver that resumes skips the runs already there).
PY=${PYTHON:-.venv/bin/python}
if [ -n "${KEEP:-}" ]; then
  SCRATCH=$KEEP
  mkdir -p "$SCRATCH"
else
  SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/stragglerkit-bench.XXXXXX")
  trap 'rm -rf "$SCRATCH"' EXIT
fi
bench() {
  "$PY" -m stragglerkit.cli bench "$@" || "$PY" -m stragglerkit.cli bench "$@"
}
train_bench() {
  "$PY" -m profiling.lab.train "$@" || "$PY" -m profiling.lab.train "$@"
}
