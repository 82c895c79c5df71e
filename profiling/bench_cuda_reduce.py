"""Bandwidth of the CUDA reduction kernel (csrc/reduce_cuda.cu) against the device's copy bandwidth.

For each dtype, on ``--mib`` MiB buffers: the device-to-device copy ``dst.copy_(src)`` (bytes read
plus written: 2 x size), the kernel ``dst += src`` through ``stragglerkit._C.reduce_add_`` (3 x
size) and torch's own ``dst.add_(src)`` for reference (3 x size). Each figure is the median of
``--repeats`` timings of ``--iters`` back-to-back launches between CUDA events, after a warm-up.
The target: the kernel reaches at least 85 % of the copy's bandwidth. Overwrites ``--json``
(default ``profiling/results/bench_cuda_reduce.json``); exits 1 when a dtype misses the target.
Needs a CUDA GPU and stragglerkit built with its kernel (scripts/gpu_check.sh does both).

Example::

    python profiling/bench_cuda_reduce.py --mib 256
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "profiling"))

TARGET_SHARE = 0.85
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
}


def seconds_per_launch(launch: Callable[[], object], iters: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of ``iters`` back-to-back launches (CUDA events)."""
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            launch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000.0 / iters)
    return statistics.median(samples)


def measure(dtype: torch.dtype, nbytes: int, iters: int, repeats: int) -> dict[str, float]:
    from stragglerkit.runtime.executor import native

    numel = nbytes // dtype.itemsize
    dst = torch.zeros(numel, dtype=dtype, device="cuda")
    src = torch.ones(numel, dtype=dtype, device="cuda")
    copy_s = seconds_per_launch(lambda: dst.copy_(src), iters, repeats)
    kernel_s = seconds_per_launch(lambda: native().reduce_add_(dst, src), iters, repeats)
    torch_s = seconds_per_launch(lambda: dst.add_(src), iters, repeats)
    size = numel * dtype.itemsize
    copy_bw, kernel_bw, torch_bw = 2 * size / copy_s, 3 * size / kernel_s, 3 * size / torch_s
    return {
        "copy_GBps": copy_bw / 1e9,
        "kernel_GBps": kernel_bw / 1e9,
        "torch_add_GBps": torch_bw / 1e9,
        "kernel_share_of_copy": kernel_bw / copy_bw,
        "torch_add_share_of_copy": torch_bw / copy_bw,
        "kernel_ms": kernel_s * 1e3,
    }


def main() -> int:
    from _env import RESULTS, write_summary

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="buffer size in MiB (default 256)")
    parser.add_argument("--iters", type=int, default=20, help="launches per timing (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per figure; the median is kept (default 5)")
    parser.add_argument("--json", default=str(RESULTS / "bench_cuda_reduce.json"), help="summary to overwrite")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_cuda_reduce: no CUDA GPU here", file=sys.stderr)
        return 2
    results = {name: measure(dtype, args.mib << 20, args.iters, args.repeats) for name, dtype in DTYPES.items()}
    print(f"{'dtype':<9} {'copy GB/s':>10} {'kernel GB/s':>12} {'share':>6} {'torch add GB/s':>15} {'share':>6}")
    for name, r in results.items():
        print(
            f"{name:<9} {r['copy_GBps']:>10.0f} {r['kernel_GBps']:>12.0f} {r['kernel_share_of_copy']:>6.1%} "
            f"{r['torch_add_GBps']:>15.0f} {r['torch_add_share_of_copy']:>6.1%}"
        )
    missed = [name for name, r in results.items() if r["kernel_share_of_copy"] < TARGET_SHARE]
    write_summary(
        args.json,
        "bench_cuda_reduce",
        {
            "device": torch.cuda.get_device_name(),
            "buffer_MiB": args.mib,
            "iters": args.iters,
            "repeats": args.repeats,
            "target_share_of_copy": TARGET_SHARE,
            "met": not missed,
            "results": results,
        },
    )
    if missed:
        print(f"below {TARGET_SHARE:.0%} of the copy bandwidth: {', '.join(missed)}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
