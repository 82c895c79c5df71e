# Sourced by bench_acceptance.sh and the bench_train*.sh drivers (all run from the repository
# root): the Python to run, a scratch folder for the per-run files (removed on exit; only the
# summary stays), and one run of `stragglerkit bench` (bench) or of the training bench
# (train_bench: python -m profiling.lab.train) that is tried a second time if the first fails
# (the shaping check refuses a run when a busy machine measures a link under its rate).
PY=${PYTHON:-.venv/bin/python}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/stragglerkit-bench.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
bench() {
  "$PY" -m stragglerkit.cli bench "$@" || "$PY" -m stragglerkit.cli bench "$@"
}
train_bench() {
  "$PY" -m profiling.lab.train "$@" || "$PY" -m profiling.lab.train "$@"
}
