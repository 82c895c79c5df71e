#!/usr/bin/env bash
# The GPU check: builds stragglerkit._C with its CUDA kernel against the torch it finds (it installs
# nothing), then runs tests/test_gpu.py (the kernel against torch, CUDA tensors through the executor
# on 4 ranks sharing the GPU, the DDP hook with CUDA buckets, an NCCL group) and
# profiling/bench_cuda_reduce.py (the kernel's bandwidth against the device's copy bandwidth), and
# examples/megatron/train_gpt.py with 4 ranks sharing the GPU over gloo, rank 3 late, the flag off
# and on (megatron-core from the environment, or from gpu_deps/ made by scripts/gpu_deps.sh).
# Prints one summary table and exits non-zero on any failure. About 5 minutes on one H100.
#
#   scripts/gpu_check.sh [OUTDIR]     # OUTDIR: $OUT if set, else gpu_check_out/
#
# Writes into OUTDIR: build.log, tests.log, gpu_tests.xml, bench_cuda_reduce.json and
# megatron_{off,on}.{json,log}, gpu_check.json (the summary); the bench summary also overwrites profiling/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-gpu_check_out}}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1

echo "[gpu_check] $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[gpu_check] /'

echo "[gpu_check] building stragglerkit._C with the CUDA kernel (log: $OUTDIR/build.log)"
started=$(date +%s)
# Hopper unless told otherwise; every core compiles.
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  "$PYTHON" setup.py build_ext --inplace >"$OUTDIR/build.log" 2>&1
build_rc=$?
echo "$(( $(date +%s) - started ))" >"$OUTDIR/build_seconds"
if [ "$build_rc" -eq 0 ] && ! "$PYTHON" -c 'import sys, stragglerkit._C as c; sys.exit(not c.cuda_kernel)'; then
  echo "[gpu_check] the build has no CUDA kernel: is torch a CUDA build and nvcc on PATH?" | tee -a "$OUTDIR/build.log"
  build_rc=1
fi
if [ "$build_rc" -ne 0 ]; then
  tail -n 40 "$OUTDIR/build.log"
else
  echo "[gpu_check] tests/test_gpu.py"
  timeout 300 "$PYTHON" -m pytest tests/test_gpu.py -v -rP -p no:cacheprovider --junitxml="$OUTDIR/gpu_tests.xml" \
    2>&1 | tee "$OUTDIR/tests.log"
  echo "[gpu_check] profiling/bench_cuda_reduce.py"
  timeout 90 "$PYTHON" profiling/bench_cuda_reduce.py --mib 256 && true
  cp profiling/results/bench_cuda_reduce.json "$OUTDIR/" 2>/dev/null
  # megatron-core is pure Python: where it is not installed, scripts/gpu_deps.sh put a copy in gpu_deps/
  if ! "$PYTHON" -c 'import megatron.core' 2>/dev/null && [ -d gpu_deps ]; then
    export PYTHONPATH="$PWD/gpu_deps${PYTHONPATH:+:$PYTHONPATH}"
  fi
  for flag in off on; do
    echo "[gpu_check] examples/megatron/train_gpt.py on one GPU, 4 ranks over gloo, rank 3 late, flag $flag"
    extra=()
    [ "$flag" = on ] && extra=(--straggler-aware-allreduce --straggler-event-log "$OUTDIR/megatron_events.jsonl")
    timeout 300 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 4 examples/megatron/train_gpt.py \
      --backend gloo --steps 60 --late-rank 3 --late-ms 300 --log-every 10 \
      --summary-json "$OUTDIR/megatron_$flag.json" "${extra[@]}" >"$OUTDIR/megatron_$flag.log" 2>&1
    tail -n 4 "$OUTDIR/megatron_$flag.log"
  done
fi
"$PYTHON" scripts/gpu_check_summary.py "$OUTDIR" "$build_rc"
