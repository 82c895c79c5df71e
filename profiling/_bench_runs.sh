# Sourced by the side-by-side bench scripts (bench_send_buffer.sh, bench_fair_queueing.sh): the
# acceptance setting (8 ranks, 1 Gbit/s, 32 MiB float32, median of 7 iterations) and one bench run
# that is tried a second time if the first fails (the shaping check refuses a run when this busy
# machine measures a link under its rate); with RESUME=1 a result file that exists is kept.
PY=${PYTHON:-.venv/bin/python}
COMMON=(--world-size 8 --bandwidth 1Gbit --sizes 32MiB --dtype float32 --iters 7 --warmup 2)
bench() {
  local out=${*: -1}
  if [ "${RESUME:-0}" = 1 ] && [ -f "$out" ]; then return 0; fi
  "$PY" -m stragglerkit.cli bench "${COMMON[@]}" "$@" || "$PY" -m stragglerkit.cli bench "${COMMON[@]}" "$@"
}
